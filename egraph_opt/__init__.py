"""egraph-opt: an equality-saturation optimizer for ML programs.

The public API is imported lazily: ``import egraph_opt.lang.term`` loads neither egglog nor the
torch.fx capture, and ``egraph_opt.saturate_and_extract`` loads what it needs on first use."""
import importlib

_PUBLIC = {
    "saturate_and_extract": "drivers.api", "OptimizedFunction": "drivers.api",
    "explore": "drivers.explore", "Explorer": "drivers.explore",
    "curvature": "drivers.analyzer", "CurvatureReport": "drivers.analyzer",
    "capture": "frontends.capture", "CaptureError": "frontends.capture",
    "optimize": "optimization.pipeline", "Limits": "egraph.session", "Phase": "egraph.session",
    "shard": "drivers.sharded", "ShardedPlan": "drivers.sharded", "ShardingError": "drivers.sharded",
    "Term": "lang.term", "evaluate": "lang.term", "pretty": "lang.term"}
__all__ = list(_PUBLIC)


def __getattr__(name: str):
    if name not in _PUBLIC:
        raise AttributeError(f"module 'egraph_opt' has no attribute {name!r}")
    globals()[name] = value = getattr(importlib.import_module(f".{_PUBLIC[name]}", __name__), name)
    return value


def __dir__():
    return sorted(set(globals()) | set(_PUBLIC))
