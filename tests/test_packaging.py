"""The wheel users install holds every module of the source tree, under the names the package
imports them by (a package listed by hand once went missing: ``egraph_opt.sharding``)."""
import pathlib
import shutil
import subprocess
import sys
import zipfile

ROOT = pathlib.Path(__file__).resolve().parent.parent
#: source folder -> the package it installs as (setup.py's mapping)
FOLDERS = {"egraph_opt": "egraph_opt", "rulesets": "egraph_opt/rulesets",
           "extractors": "egraph_opt/extractors", "kernels": "egraph_opt/kernels"}


def test_the_wheel_holds_every_module_of_the_source_tree(tmp_path):
    tree = tmp_path / "tree"  # a copy: a build/ folder in the checkout may hold stale modules
    tree.mkdir()
    for name in ("setup.py", "pyproject.toml", "README.md", *FOLDERS):
        copy = shutil.copytree if (ROOT / name).is_dir() else shutil.copy
        copy(ROOT / name, tree / name, **({"ignore": shutil.ignore_patterns("__pycache__")}
                                         if copy is shutil.copytree else {}))
    built = subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation",
                            "-w", str(tmp_path), str(tree)], capture_output=True, text=True, timeout=300)
    assert built.returncode == 0, built.stderr
    wheel, = tmp_path.glob("egraph_opt-*.whl")
    shipped = {n for n in zipfile.ZipFile(wheel).namelist() if n.endswith(".py")}
    source = {f"{FOLDERS[path.parts[0]]}/{'/'.join(path.parts[1:])}"
              for folder in FOLDERS for path in
              (p.relative_to(ROOT) for p in (ROOT / folder).rglob("*.py")) if "__pycache__" not in path.parts}
    assert source - shipped == set()
    assert "egraph_opt/sharding/__init__.py" in shipped and "egraph_opt/kernels/triton/__init__.py" in shipped
    assert shipped - source == set()  # nothing else: no tests, no benchmarks
