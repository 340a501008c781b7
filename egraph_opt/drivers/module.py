"""``saturate_and_extract(module)``: an nn.Module again, as torch.compile's ``OptimizedModule`` is,
so code that trains, moves, saves or inspects a model keeps working on the optimized one.
The wrapper shares the original's parameter, buffer and submodule tables, so every name is the
original's: a checkpoint of either loads into the other.
"""
from __future__ import annotations

import torch

_OWN = ("_orig_mod", "_optimized")  # the wrapper's own attributes; every other one is the original's
_PLANS = ("report", "egraph", "plans")  # the OptimizedFunction's, as on a decorated function


class OptimizedModule(torch.nn.Module):
    """``module`` run through its optimized plans; ``.report``, ``.egraph``, ``.plans`` as on a
    decorated function, the rest (``.eval()``, ``.to()``, attributes...) the original's."""

    def __init__(self, module: torch.nn.Module, optimized):  # optimized: api.OptimizedFunction, which makes it
        super().__init__()
        own = self.__dict__
        own["_orig_mod"], own["_optimized"] = module, optimized
        for table in ("_parameters", "_buffers", "_modules"):  # one table: one set of names
            own[table] = module.__dict__[table]
        del own["training"]  # read through __getattr__: the original's flag is the one its code reads

    def forward(self, *args, **kwargs):
        return self._optimized(*args, **kwargs)

    @property
    def fn(self) -> torch.nn.Module:
        """The original module, as ``fn`` is on a decorated function (pictures run it beside the plan)."""
        return self._orig_mod

    def __getattr__(self, name: str):
        if name in _OWN:
            return self.__dict__[name]
        if name in _PLANS:
            return getattr(self.__dict__["_optimized"], name)
        return getattr(self.__dict__["_orig_mod"], name)

    def __setattr__(self, name: str, value) -> None:
        setattr(self._orig_mod, name, value)

    def __delattr__(self, name: str) -> None:
        delattr(self._orig_mod, name)

    def train(self, mode: bool = True) -> OptimizedModule:
        self._orig_mod.train(mode)  # its own override, if it has one, runs too
        return self

    def _apply(self, fn, recurse: bool = True) -> OptimizedModule:  # .to(), .cuda(), .half()...
        self._orig_mod._apply(fn, recurse)
        return self

    def state_dict(self, *args, **kwargs):
        return self._orig_mod.state_dict(*args, **kwargs)

    def load_state_dict(self, *args, **kwargs):
        return self._orig_mod.load_state_dict(*args, **kwargs)

    def _load_from_state_dict(self, *args, **kwargs):  # a parent's load_state_dict reaches it so
        return self._orig_mod._load_from_state_dict(*args, **kwargs)

    def __repr__(self) -> str:
        return f"OptimizedModule({self._orig_mod!r})"

    def __dir__(self):
        return sorted(set(super().__dir__()) | set(dir(self._orig_mod)) | set(_PLANS))
