"""The package shows the flow: each stage imports only the stages before it, and no module
imports itself back through another. Importing the Term language loads neither egglog nor the
torch.fx capture."""
import ast
import pathlib
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parent.parent
#: stages in the order data flows through them; a module may import its own stage and earlier ones
STAGES = ["lang", "frontends", "analysis", "egraph", "rulesets", "profiling", "extractors",
          "kernels", "optimization", "sharding", "backends", "validate", "drivers"]
FOLDERS = {"rulesets": ROOT / "rulesets", "extractors": ROOT / "extractors",
           "kernels": ROOT / "kernels"}


def _modules() -> dict[str, pathlib.Path]:
    """egraph_opt's modules by dotted name (the three top-level folders install as subpackages)."""
    found = {}
    roots = [(ROOT / "egraph_opt", "egraph_opt")] + [(p, f"egraph_opt.{n}") for n, p in FOLDERS.items()]
    for folder, prefix in roots:
        for path in folder.rglob("*.py"):
            parts = path.relative_to(folder).with_suffix("").parts
            name = ".".join((prefix, *parts)).removesuffix(".__init__")
            found[name] = path
    return found


def _imports(name: str, path: pathlib.Path, known: set[str]) -> set[str]:
    """egraph_opt modules that ``name`` imports (anywhere in it, type-checking blocks included)."""
    package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[:len(package.split(".")) - node.level + 1]
                base = ".".join(anchor + ([base] if base else []))
            targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in known else base for a in node.names]
        else:
            continue
        for target in targets:
            while target and target not in known:
                target = target.rpartition(".")[0]
            if target and target != name:
                out.add(target)
    return out


def _stage(module: str) -> int | None:
    parts = module.split(".")
    return STAGES.index(parts[1]) if len(parts) > 1 and parts[1] in STAGES else None


def test_every_module_belongs_to_a_stage():
    loose = [m for m in _modules() if m != "egraph_opt" and _stage(m) is None]
    assert loose == [], f"modules outside the stage packages: {loose}"


def test_no_stage_imports_a_later_one():
    modules = _modules()
    upward = [f"{m} -> {t}" for m, p in modules.items() if _stage(m) is not None
              for t in _imports(m, p, set(modules)) if _stage(t) is not None and _stage(t) > _stage(m)]
    assert upward == []


def test_no_import_cycle():
    modules = _modules()
    graph = {m: _imports(m, p, set(modules)) - {"egraph_opt"} for m, p in modules.items()}
    # a package's __init__ importing its own modules is how packages work: not a cycle
    graph = {m: {t for t in ts if not t.startswith(m + ".")} for m, ts in graph.items()}
    state: dict[str, int] = {}

    def visit(start: str) -> list[str] | None:
        stack = [(start, iter(sorted(graph[start])))]
        path = [start]
        state[start] = 1
        while stack:
            node, children = stack[-1]
            child = next(children, None)
            if child is None:
                state[node] = 2
                stack.pop()
                path.pop()
            elif state.get(child) == 1:
                return path[path.index(child):] + [child]
            elif child not in state:
                state[child] = 1
                stack.append((child, iter(sorted(graph[child]))))
                path.append(child)
        return None

    for m in sorted(graph):
        if m not in state:
            cycle = visit(m)
            assert cycle is None, " -> ".join(cycle)


def test_the_term_language_loads_neither_egglog_nor_fx_capture():
    code = ("import sys, egraph_opt.lang.term, egraph_opt.lang.pattern, egraph_opt.lang.program; "
            "print(sorted(m for m in sys.modules if m.split('.')[0] == 'egglog' "
            "or m in ('egraph_opt.frontends.capture', 'egraph_opt.drivers.api')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_the_public_api_is_imported_lazily():
    code = ("import sys, egraph_opt; before = 'egraph_opt.drivers.api' in sys.modules; "
            "egraph_opt.saturate_and_extract; print(before, 'egraph_opt.drivers.api' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["False", "True"]
