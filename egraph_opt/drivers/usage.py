"""What the command line tells its user: a failure they can act on, and argument types whose
refusal is one line (argparse then exits with status 2)."""
from __future__ import annotations

import argparse
import importlib.util
import os
import shutil
import sys
from pathlib import Path
from typing import Callable


class Failure(Exception):
    """A failure the user can act on: its message is the whole error line (exit status 1)."""


class MissingExtra(ImportError):
    """A feature whose optional dependencies are not installed: the message names the extra."""


#: each extra of pyproject.toml and the modules that show it is installed
EXTRAS = {"onnx": ("onnx", "onnxruntime", "onnxscript", "tqdm"), "triton": ("triton",), "cluster": ("distributed",),
          "report": ("matplotlib",)}


def require(extra: str, what: str) -> None:
    """Refuse ``what`` in one line naming the extra to install, before any work (report's dot: graphviz-pure)."""
    missing = [m for m in EXTRAS[extra] if importlib.util.find_spec(m) is None]
    if extra == "report":
        missing += [] if find_dot() else ["Graphviz dot"]
    if missing:
        raise MissingExtra(f"{what} needs {', '.join(missing)}: pip install 'egraph-opt[{extra}]'")


def find_dot() -> str | None:
    """``$EGRAPH_OPT_DOT`` (None: no program), else ``dot`` or ``graphviz-pure`` on PATH or beside Python."""
    if (chosen := os.environ.get("EGRAPH_OPT_DOT")) is not None:
        return chosen if shutil.which(chosen) else None
    beside = Path(sys.executable).parent / "graphviz-pure"
    return shutil.which("dot") or shutil.which("graphviz-pure") or (str(beside) if beside.exists() else None)


class ModelFailure(Exception):
    """One model of a batch could not be optimized: the reason goes into its report line."""


def argument(parse: Callable, refusal: str):
    """An argparse type: ``parse(text)``, refused as ``repr(text) + refusal`` where it raises or gives None."""
    def checked(text: str):
        try:
            value = parse(text)
        except (ValueError, TypeError, RuntimeError):
            value = None
        if value is None:
            raise argparse.ArgumentTypeError(f"{text!r}{refusal}")
        return value
    return checked


def at_least(minimum: int):
    """An argparse type: an integer of at least ``minimum``."""
    return argument(lambda text: int(text) if int(text) >= minimum else None, f" is not an integer >= {minimum}")


def new_file_mode() -> int:
    """A new file's mode under ``open`` (0o666 less the umask): mkstemp and onnx make files 0600."""
    mask = os.umask(0o077)  # read by setting: a file another thread makes meanwhile is private
    os.umask(mask)
    return 0o666 & ~mask


def html(path: str) -> bool:
    """Whether a report path names one HTML page (else the report is JSON)."""
    return path.endswith((".html", ".htm"))
