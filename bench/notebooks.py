"""Seconds each notebook takes top to bottom in a real Jupyter kernel, against the 60-second goal
of a fresh clone (issue 29). A bench, not a test: a loaded machine slows a notebook several times.

    python bench/notebooks.py
"""
import pathlib
import sys
import tempfile
import time

import nbclient
import nbformat

GOAL_S = 60


def main() -> int:
    slow = 0
    for path in sorted((pathlib.Path(__file__).parent.parent / "notebooks").glob("*.ipynb")):
        nb = nbformat.read(path, as_version=4)
        start = time.perf_counter()
        with tempfile.TemporaryDirectory() as tmp:
            nbclient.NotebookClient(nb, timeout=600, kernel_name="python3",
                                    resources={"metadata": {"path": tmp}}).execute()
        seconds = time.perf_counter() - start
        slow += seconds > GOAL_S
        print(f"{path.stem:28s} {seconds:6.1f} s {'over the goal' if seconds > GOAL_S else ''}")
    return 1 if slow else 0


if __name__ == "__main__":
    sys.exit(main())
