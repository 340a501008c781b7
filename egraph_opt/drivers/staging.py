"""Outputs appear whole or not at all: a model (and its data file) is staged in a folder beside its target,
then claimed by hard links, which fail where the name exists. The process staging in a folder holds a lock on
it (flock, released when it dies, ``kill -9`` included), so a later run removes exactly the folders no live
process owns, and takes back a unit a killed process had only half linked in."""
from __future__ import annotations

import contextlib
import fcntl
import filecmp
import glob
import hashlib
import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Callable

import onnx

from ..frontends.onnx_frontend import external_files
from .usage import ModelFailure, new_file_mode

_MADE_FROM = "egraph-opt:made-from"  # an output's metadata: its model's digest and the run's options
_SAME_OUTPUT = ("objective", "opset", "seed", "latency_runs")  # the options that change what is written
_PREFIX = ".egraph-opt-"


def claim(stage: Callable[[str], None], target: str, names: list[str], overwrite: bool = False,
          run: str = "", same_is_ours: bool = False) -> None:
    """``stage(folder)`` writes the files ``names`` (data first, model last) into a folder beside ``target``, then each
    is linked beside it: of two runs one fails, and no model appears without its data. ``same_is_ours``: files there
    with the same bytes count as claimed (a cluster reruns a model whose worker died holding its result)."""
    directory = os.path.dirname(target)
    folder = tempfile.mkdtemp(prefix=f"{_PREFIX}{run}-" if run else _PREFIX, dir=directory or ".")
    held = os.open(folder, os.O_RDONLY | os.O_DIRECTORY)
    fcntl.flock(held, fcntl.LOCK_EX)  # ours while this process lives: cleaners pass it by
    claimed: list[str] = []
    try:
        stage(folder)
        if overwrite:
            for old in (target, target + ".data"):
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(old)
        for name in names:
            staged, final = os.path.join(folder, name), os.path.join(directory, name)
            try:
                os.link(staged, final)
            except FileExistsError:
                if same_is_ours and filecmp.cmp(staged, final, shallow=False):
                    continue
                raise
            claimed.append(final)
        claimed = []  # all in place: keep them
    except FileExistsError as e:
        raise ModelFailure(f"{e.filename2} exists (use --force to overwrite)") from None
    finally:
        for path in claimed:  # a unit only half in place: take it back
            os.unlink(path)
        shutil.rmtree(folder, ignore_errors=True)
        os.close(held)


def write_atomic(model: onnx.ModelProto, target: str, external: bool, overwrite: bool = False,
                 run: str = "", same_is_ours: bool = False) -> None:
    """Write ``model`` to ``target`` (its tensors to ``target.data`` when ``external``) by ``claim``."""
    base = os.path.basename(target)
    def save(folder: str) -> None:
        onnx.save_model(model, os.path.join(folder, base), save_as_external_data=external,
                        all_tensors_to_one_file=True, location=base + ".data", size_threshold=1024)
        if external:
            os.chmod(os.path.join(folder, base + ".data"), new_file_mode())  # onnx makes it 0600
    claim(save, target, [base + ".data", base] if external else [base], overwrite, run, same_is_ours)


def write_files(files: dict[str, bytes], target: str, overwrite: bool = False, run: str = "",
                same_is_ours: bool = False) -> None:
    """Claim ``target`` from the bytes of its files (the model's base name and its data files)."""
    def save(folder: str) -> None:
        for name, data in files.items():
            Path(folder, name).write_bytes(data)
    base = os.path.basename(target)
    claim(save, target, sorted(files, key=lambda name: name == base), overwrite, run, same_is_ours)


def remove_staging(directory: str, run: str = "", before: float | None = None) -> None:
    """Remove the staging folders in ``directory`` (of ``run``, or any) that no live process holds (made before
    ``before``): killed processes'. A unit one had linked in only part of is taken back: a rerun writes it whole."""
    for folder in glob.glob(os.path.join(glob.escape(directory), f"{_PREFIX}{run}-*" if run else f"{_PREFIX}*")):
        try:
            if before is not None and os.lstat(folder).st_mtime >= before:
                continue
            held = os.open(folder, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
        except OSError:  # gone meanwhile, or not a folder of ours
            continue
        try:
            fcntl.flock(held, fcntl.LOCK_EX | fcntl.LOCK_NB)
            names = os.listdir(folder)
            placed = [n for n in names if os.path.exists(os.path.join(directory, n))
                      and os.path.samefile(os.path.join(folder, n), os.path.join(directory, n))]
            if len(placed) < len(names):  # a unit only half linked in: take it back
                for name in placed:
                    os.unlink(os.path.join(directory, name))
            shutil.rmtree(folder, ignore_errors=True)
        except OSError:  # held by a live process (BlockingIOError), or gone meanwhile
            pass
        finally:
            os.close(held)


def made_from(path: str, options: dict) -> str:
    """An output's source: its model's digest (data files' too) and the options that change the output.
    Stored in the output, it tells a rerun its own outputs (kept) from other files in the way."""
    digest = hashlib.sha256()
    for name in [os.path.basename(path), *external_files(path, onnx.load(path, load_external_data=False))]:
        with open(os.path.join(os.path.dirname(path), name), "rb") as f:
            digest.update(hashlib.file_digest(f, "sha256").digest())
    return json.dumps({"sha256": digest.hexdigest(), **{k: options.get(k) for k in _SAME_OUTPUT}}, sort_keys=True)


def stamp(model: onnx.ModelProto, source: str) -> None:
    """Record ``made_from`` in the model's metadata (replacing the record its input may carry)."""
    kept = [p for p in model.metadata_props if p.key != _MADE_FROM]
    del model.metadata_props[:]
    model.metadata_props.extend(kept)
    model.metadata_props.add(key=_MADE_FROM, value=source)


def earlier_output(path: str, target: str, options: dict) -> dict | None:
    """None where ``target`` is free; else "kept", the output an earlier run made from this model with these
    options (a rerun after a kill finishes the rest), or "failed": another file is in the way."""
    if not os.path.lexists(target):
        return None
    try:
        props = onnx.load(target, load_external_data=False).metadata_props
        there = json.loads(next((p.value for p in props if p.key == _MADE_FROM), "{}"))
        ours = json.loads(made_from(path, options))
    except Exception:  # noqa: BLE001 - unreadable output or model: in the way, the plain reason
        there, ours = {}, None
    if there == ours:
        return {"status": "kept", "reason": f"{target} was written from this model by an earlier run"}
    other = " (made from this model with other options)" if ours and there.get("sha256") == ours["sha256"] else ""
    return {"status": "failed", "reason": f"{target} exists{other} (use --force to overwrite)"}
