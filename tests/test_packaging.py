"""The wheel users install holds every module of the source tree, under the names the package
imports them by (a package listed by hand once went missing: ``egraph_opt.sharding``), and works
whole once installed: in a fresh virtual environment, outside the repository, with the core
dependencies alone (this machine's torch: nothing is downloaded), then each extra added."""
import importlib.machinery
import importlib.util
import json
import os
import pathlib
import re
import shutil
import subprocess
import sys
import sysconfig
import zipfile

import onnx
import pytest
from importlib.metadata import PackageNotFoundError, distribution
from packaging.requirements import Requirement

from egraph_opt.drivers.usage import EXTRAS
from test_cli_reliability import tiny_model

ROOT = pathlib.Path(__file__).resolve().parent.parent
#: source folder -> the package it installs as (setup.py's mapping)
FOLDERS = {"egraph_opt": "egraph_opt", "rulesets": "egraph_opt/rulesets",
           "extractors": "egraph_opt/extractors", "kernels": "egraph_opt/kernels"}
#: the modules whose absence an extra explains (what the extras' packages import as)
OPTIONAL = {m for modules in EXTRAS.values() for m in modules} | {"dask", "tqdm", "onnx_ir"}


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> pathlib.Path:
    folder = tmp_path_factory.mktemp("wheel")
    tree = folder / "tree"  # a copy: a build/ folder in the checkout may hold stale modules
    tree.mkdir()
    for name in ("setup.py", "pyproject.toml", "README.md", *FOLDERS):
        copy = shutil.copytree if (ROOT / name).is_dir() else shutil.copy
        copy(ROOT / name, tree / name, **({"ignore": shutil.ignore_patterns("__pycache__")}
                                         if copy is shutil.copytree else {}))
    built = subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation",
                            "-w", str(folder), str(tree)], capture_output=True, text=True, timeout=300)
    assert built.returncode == 0, built.stderr
    found, = folder.glob("egraph_opt-*.whl")
    return found


def test_the_wheel_holds_every_module_of_the_source_tree(wheel):
    shipped = {n for n in zipfile.ZipFile(wheel).namelist() if n.endswith(".py")}
    source = {f"{FOLDERS[path.parts[0]]}/{'/'.join(path.parts[1:])}"
              for folder in FOLDERS for path in
              (p.relative_to(ROOT) for p in (ROOT / folder).rglob("*.py")) if "__pycache__" not in path.parts}
    assert source - shipped == set()
    assert "egraph_opt/sharding/__init__.py" in shipped and "egraph_opt/kernels/triton/__init__.py" in shipped
    assert shipped - source == set()  # nothing else: no tests, no benchmarks


def test_no_folder_of_the_clone_hides_an_installed_package_of_its_name():
    """``python -m pytest`` puts the clone's root first on sys.path, where ``kernels/`` (ours, installed as
    ``egraph_opt.kernels``) hid Hugging Face's ``kernels``, which transformers 5.25 imports: every model failed to
    import. The root conftest puts the root last; a bare name finds what is installed where something is."""
    elsewhere = [p for p in sys.path if pathlib.Path(p or os.curdir).resolve() != ROOT]
    for folder in set(FOLDERS) - {"egraph_opt"}:
        spec = importlib.util.find_spec(folder)
        ours = spec is not None and pathlib.Path(spec.origin).resolve().parent == ROOT / folder
        assert not ours or importlib.machinery.PathFinder.find_spec(folder, elsewhere) is None, \
            f"import {folder} finds the clone's folder {spec.origin}, not the package installed"


def _closure(requirements: list[str]) -> set:
    """The installed distributions ``requirements`` need, with theirs (markers and extras heeded)."""
    found, todo = {}, [Requirement(r) for r in requirements]
    while todo:
        req = todo.pop()
        try:
            dist = distribution(req.name)
        except PackageNotFoundError:  # an optional dependency of a dependency, absent here too
            continue
        key = (dist.metadata["Name"].lower(), frozenset(req.extras))
        if key in found:
            continue
        found[key] = dist
        for text in dist.requires or []:
            sub = Requirement(text)
            if sub.marker is None or any(sub.marker.evaluate({"extra": e}) for e in {"", *req.extras}):
                todo.append(sub)
    return set(found.values())


def _add(site: pathlib.Path, requirements: list[str]) -> None:
    """Make the distributions ``requirements`` need importable in ``site``, as links to this
    environment's copies (torch is large and is never downloaded)."""
    for dist in _closure(requirements):
        if dist.metadata["Name"].lower() == "egraph-opt":
            continue
        for top in {pathlib.Path(str(f)).parts[0] for f in dist.files or [] if not str(f).startswith("..")}:
            if not (site / top).exists() and (pathlib.Path(dist.locate_file(top))).exists():
                (site / top).symlink_to(dist.locate_file(top))


@pytest.fixture(scope="module")
def user(wheel, tmp_path_factory):
    """A fresh environment with the wheel installed and the core dependencies alone; ``run``
    runs a command in it, in a folder outside the repository."""
    home = tmp_path_factory.mktemp("user")
    env = home / "venv"
    subprocess.run([sys._base_executable, "-m", "venv", "--without-pip", str(env)], check=True, timeout=120)
    python = env / "bin" / "python"
    installed = subprocess.run([sys.executable, "-m", "pip", "--python", str(python), "install", "-q", "--no-deps",
                                "--no-index", str(wheel)], capture_output=True, text=True, timeout=300)
    assert installed.returncode == 0, installed.stderr
    site = pathlib.Path(subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                                       capture_output=True, text=True, check=True).stdout.strip())
    _add(site, [str(r) for r in distribution("egraph-opt").requires or [] if "extra ==" not in str(r)])
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "VIRTUAL_ENV"))}
    clean["PATH"] = f"{env / 'bin'}{os.pathsep}{clean.get('PATH', '')}"
    clean["EGRAPH_OPT_PROFILE_DB"] = str(home / "profile.sqlite")

    def run(*command: str, stdin: str | None = None) -> subprocess.CompletedProcess:
        return subprocess.run(command, cwd=home, env=clean, input=stdin, capture_output=True, text=True, timeout=300)
    run.python, run.site, run.home = str(python), site, home
    return run


IMPORT_ALL = """
import contextlib, importlib, io, json, pkgutil, sys
from egraph_opt.drivers.cli import main
ran = []
for argv in json.loads(sys.argv[1]):  # as the console script runs each: its main's status and output
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            status = main(argv)
        except SystemExit as e:  # argparse's --help
            status = e.code
    ran.append([status, out.getvalue(), err.getvalue()])
import egraph_opt
failed = {}
for m in pkgutil.walk_packages(egraph_opt.__path__, "egraph_opt."):
    try:
        importlib.import_module(m.name)
    except ModuleNotFoundError as e:
        failed[m.name] = e.name
print(json.dumps([egraph_opt.__file__, failed, ran]))
"""


def _imports(user, *commands: list[str]) -> tuple[dict, list[subprocess.CompletedProcess]]:
    """The installed modules that fail to import (name -> the module missing), and ``commands`` of
    ``egraph-opt`` run before them in the same process (a process per --help spent seconds importing torch)."""
    done = user(user.python, "-c", IMPORT_ALL, json.dumps(commands))
    assert done.returncode == 0, done.stderr
    where, failed, ran = json.loads(done.stdout.splitlines()[-1])
    assert where.startswith(str(user.site)), where  # the wheel's modules, not the source tree's
    return failed, [subprocess.CompletedProcess(c, *r) for c, r in zip(commands, ran)]


def _readme_examples() -> list[str]:
    """The README's ```python blocks: each runs as pasted (fragments are marked ```py)."""
    return re.findall(r"^```python\n(.*?)^```", (ROOT / "README.md").read_text(), re.S | re.M)


def test_a_user_install_works_whole(user):
    # the core dependencies alone: what fails to import is what an extra brings, and says so
    failed, helps = _imports(user, *([command, "--help"] for command in ("rules", "kernels", "profile")))
    assert all(name.split(".")[0] in OPTIONAL for name in failed.values()), failed
    assert "egraph_opt.sharding" not in failed and "egraph_opt.drivers.explore" not in failed
    assert user("egraph-opt", "--version").stdout.startswith("egraph-opt 0.")
    for shown in helps:
        assert shown.returncode == 0 and "usage: egraph-opt" in shown.stdout, shown.stderr
    onnx.save(tiny_model(), str(user.home / "m.onnx"))
    refused = user("egraph-opt", "onnx", "m.onnx", "--out", "o")
    assert refused.returncode == 1 and refused.stderr.count("\n") == 1, refused.stderr
    assert "pip install 'egraph-opt[onnx]'" in refused.stderr
    to_html = user(user.python, "-c", "from egraph_opt.drivers.api import Report; Report('f(x)').to_html('r.html')")
    assert "pip install 'egraph-opt[report]'" in to_html.stderr.splitlines()[-1]

    # with [onnx] and not [report]: an HTML report is refused before any model is optimized
    _add(user.site, ["onnx>=1.16", "onnxruntime>=1.18", "onnxscript>=0.3", "tqdm>=4.66"])
    refused = user("egraph-opt", "onnx", "m.onnx", "--out", "o", "--report", "r.html")
    assert refused.returncode == 1 and "pip install 'egraph-opt[report]'" in refused.stderr, refused.stderr
    assert not (user.home / "o" / "m.onnx").exists() and not (user.home / "r.html").exists()

    # every extra: every module imports, every command and example runs
    (user.site / "zz-every-extra.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    dot = pathlib.Path(sys.executable).parent / "graphviz-pure"  # a program graphviz-pure installs
    (pathlib.Path(user.python).parent / dot.name).symlink_to(dot)
    failed, helps = _imports(user, *([command, "--help"] for command in ("rules", "kernels", "profile", "onnx")))
    assert failed == {}
    for shown in helps:
        assert shown.returncode == 0
    done = user("egraph-opt", "onnx", "m.onnx", "--out", "o", "--report", "r.html", "--latency-runs", "0")
    assert done.returncode == 0 and (user.home / "r.html").exists(), done.stderr
    assert len(_readme_examples()) >= 2
    for example in _readme_examples():  # as pasted, outside the repository
        ran = user(user.python, "-", stdin=example)
        assert ran.returncode == 0, ran.stderr
