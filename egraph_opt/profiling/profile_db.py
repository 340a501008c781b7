"""Measured kernel latencies, one SQLite file shared by every process (WAL mode, one transaction per write, so two
profilers can write at once). Records are appended; a lookup takes the newest. The path is the user's: a file there
that is not ours is a `ForeignFileError`, left untouched; a corrupt database of ours is set aside with a warning,
never overwritten. Callers that only cache latencies catch `UNUSABLE`.
>>> import tempfile, pathlib
>>> with ProfileDB(pathlib.Path(tempfile.mkdtemp()) / "p.sqlite") as db:
...     db.add(Record(kernel="exp", backend="torch", device="cpu: test", dtype="float32",
...                   shapes=((4, 4),), attrs={}, runs=10, median_s=2e-6, spread_s=1e-7))
...     db.lookup("exp", "torch", "cpu: test", "float32", ((4, 4),), {}).median_s
2e-06
"""
from __future__ import annotations

import contextlib
import json
import os
import shutil
import sqlite3
import time
import warnings
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path
from typing import Iterable, Mapping, Sequence

SCHEMA_VERSION = 1  # only what older code cannot read changes it: a column (config) is added in place
APPLICATION_ID = 0x45474F50  # "EGOP", in the header of every database we create (PRAGMA application_id)
ENV_VAR, _TABLE = "EGRAPH_OPT_PROFILE_DB", "measurements"
_SQLITE_HEADER = b"SQLite format 3\x00"
_TIMEOUT_S = 60  # how long a process waits for another's write lock
_CORRUPT_CODES = (sqlite3.SQLITE_CORRUPT, sqlite3.SQLITE_NOTADB)
_SCHEMA = f"""
CREATE TABLE {_TABLE} (
    id INTEGER PRIMARY KEY,
    kernel TEXT NOT NULL,
    backend TEXT NOT NULL,
    device TEXT NOT NULL,
    dtype TEXT NOT NULL,
    shape_key TEXT NOT NULL,          -- canonical JSON of input shapes and attributes
    runs INTEGER NOT NULL CHECK (runs > 0),
    median_s REAL NOT NULL CHECK (median_s > 0),
    spread_s REAL NOT NULL CHECK (spread_s >= 0),   -- interquartile range of the runs
    versions TEXT NOT NULL,           -- JSON: library name -> version
    recorded_at REAL NOT NULL,        -- Unix time
    config TEXT                       -- JSON: the kernel's fastest configuration (NULL: its only one)
);
CREATE INDEX {_TABLE}_group ON {_TABLE} (kernel, backend, device, dtype, shape_key);
PRAGMA user_version = {SCHEMA_VERSION};
PRAGMA application_id = {APPLICATION_ID};
"""
_COLUMNS = "kernel, backend, device, dtype, shape_key, runs, median_s, spread_s, versions, recorded_at, config"
_OUR_TABLE_SQL = f"CREATE TABLE {_TABLE} (".encode()  # in the schema on page 1 of a database of ours


class ProfileDBWarning(UserWarning):
    """A profile database file was set aside, or could not be used and was done without."""


class ProfileDBError(RuntimeError):
    """The profile database cannot be opened or used; the message names the file and the cause."""


class ForeignFileError(ProfileDBError):
    """The path holds a file that is not an egraph-opt profile database: it is never moved or written."""


class SchemaVersionError(ProfileDBError):
    """The file is an egraph-opt profile database of a schema version this code does not read."""


#: what a database that cannot be used raises (opened, read or written), as opposed to a bug
UNUSABLE = (ProfileDBError, sqlite3.Error, OSError)


def default_path() -> Path:
    """$EGRAPH_OPT_PROFILE_DB, else $XDG_CACHE_HOME (or ~/.cache)/egraph-opt/profile.sqlite."""
    if os.environ.get(ENV_VAR):
        return Path(os.environ[ENV_VAR]).expanduser()
    cache = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(cache).expanduser() / "egraph-opt" / "profile.sqlite"


def library_versions() -> dict[str, str]:
    """Versions of the libraries a latency depends on (those installed), for the record."""
    versions = {}
    for name in ("torch", "egglog", "triton"):
        with contextlib.suppress(metadata.PackageNotFoundError):
            versions[name] = metadata.version(name)
    return versions


def shape_key(shapes: Sequence[Sequence[int]], attrs: Mapping[str, object]) -> str:
    """Canonical JSON of input shapes and attributes: equal shapes give equal keys.
    >>> shape_key([(2, 3), [3]], {"keepdim": False, "axis": -1})
    '{"attrs":{"axis":-1,"keepdim":false},"shapes":[[2,3],[3]]}'
    """
    rows = [list(shape) for shape in shapes]
    for dims in rows:
        if not all(isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in dims):
            raise ValueError(f"shape {shapes[rows.index(dims)]!r}: dimensions must be non-negative ints")
    try:
        return json.dumps({"attrs": dict(attrs), "shapes": rows}, sort_keys=True, separators=(",", ":"))
    except TypeError as e:
        raise ValueError(f"attributes {attrs!r} are not JSON values: {e}") from None


@dataclass(frozen=True, kw_only=True)
class Record:
    """One measurement: a kernel at one shape on one device, timed over `runs` runs."""
    kernel: str
    backend: str
    device: str
    dtype: str
    shapes: tuple[tuple[int, ...], ...]
    attrs: Mapping[str, object]
    runs: int
    median_s: float
    spread_s: float
    versions: Mapping[str, str] = field(default_factory=library_versions)
    recorded_at: float = field(default_factory=time.time)
    config: Mapping[str, object] | None = None  # the Triton configuration it ran in, its fastest

    @property
    def shape_key(self) -> str:
        return shape_key(self.shapes, self.attrs)


def _from_row(row) -> Record:
    kernel, backend, device, dtype, key, runs, median_s, spread_s, versions, recorded_at, config = row
    params = json.loads(key)
    return Record(kernel=kernel, backend=backend, device=device, dtype=dtype, attrs=params["attrs"], runs=runs,
                  shapes=tuple(tuple(s) for s in params["shapes"]), median_s=median_s, spread_s=spread_s,
                  versions=json.loads(versions), recorded_at=recorded_at, config=json.loads(config) if config else None)


def _identity(r: Record) -> tuple:
    return (r.kernel, r.backend, r.device, r.dtype, r.shape_key, r.median_s, r.recorded_at)


def _foreign_reason(path: Path) -> tuple[str | None, bool]:
    """Why the file at `path` is no usable profile database (None: absent, empty, usable), and whether it is ours anyway
    (only ours is set aside). Read through SQLite: opening the file would drop this process's POSIX locks."""
    if not path.exists() or path.stat().st_size == 0:
        return None, True
    with contextlib.closing(sqlite3.connect(path, timeout=_TIMEOUT_S)) as conn:
        try:
            tables = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type='table'")}
            ours = _TABLE in tables or conn.execute("PRAGMA application_id").fetchone()[0] == APPLICATION_ID
            check = conn.execute("PRAGMA quick_check(1)").fetchone()[0]  # a bad page fails later reads
        except sqlite3.DatabaseError as e:
            if e.sqlite_errorcode not in _CORRUPT_CODES:
                raise  # locked, busy, unreadable: a problem of access, not of the file
            with open(path, "rb") as f:  # SQLite's header and first page (read only once SQLite refused
                head = f.read(1 << 16)  # the file: no connection here then holds locks a close could drop)
            if not head.startswith(_SQLITE_HEADER):
                return "not an SQLite database", False
            ours = int.from_bytes(head[68:72], "big") == APPLICATION_ID or _OUR_TABLE_SQL in head
            return f"corrupt SQLite file ({e})", ours
    if check != "ok":
        return f"corrupt SQLite file ({' '.join(check.split())})", ours
    return (f"an SQLite database without egraph-opt's tables (has: {', '.join(sorted(tables))})", False) \
        if tables and _TABLE not in tables else (None, True)


def _set_aside(path: Path, reason: str) -> None:
    """Keep a corrupt database of ours (and its WAL side files) aside, where what is left may still be read: copied,
    then emptied in place through SQLite under its locks (renamed while another process holds it open, its closing would
    delete the fresh database's WAL: SQLite's "how to corrupt"); a file SQLite cannot write through is renamed."""
    aside = path.with_name(f"{path.name}.corrupt-{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}")
    sides = [(path.with_name(path.name + suffix), aside.with_name(aside.name + suffix))
             for suffix in ("", "-wal", "-shm")]
    emptied = False
    for side, kept in sides[:2]:
        if side.exists():
            shutil.copyfile(side, kept)
    with contextlib.suppress(sqlite3.Error), contextlib.closing(sqlite3.connect(":memory:")) as empty, \
            contextlib.closing(sqlite3.connect(path, timeout=_TIMEOUT_S)) as target:
        empty.backup(target)
        emptied = True
    if not emptied:
        for side, kept in sides:
            if side.exists():
                side.replace(kept)
    warnings.warn(f"profile database {path} is {reason}; {'copied' if emptied else 'moved'} it to {aside} "
                  "and started a fresh one", ProfileDBWarning, stacklevel=4)


class ProfileDB:
    """The database at `path` (default: `default_path()`); one per process, a context manager."""

    def __init__(self, path: str | os.PathLike | None = None):
        self.path = Path(path).expanduser() if path is not None else default_path()
        try:
            self._open()
        except (OSError, sqlite3.Error) as e:
            raise ProfileDBError(f"cannot use profile database {self.path}: {e}") from e

    def _open(self) -> None:
        if self.path.is_dir():
            raise ProfileDBError(f"profile database {self.path} is a directory")
        self.path.parent.mkdir(parents=True, exist_ok=True)
        reason, ours = _foreign_reason(self.path)
        if reason and not ours:
            raise ForeignFileError(f"profile database {self.path} is {reason}, not egraph-opt's: it is "
                                   f"left as it is; use another path (or set {ENV_VAR})")
        if reason:
            _set_aside(self.path, reason)
        self._conn = sqlite3.connect(self.path, timeout=_TIMEOUT_S, isolation_level=None)
        try:
            self._enable_wal()
            self._conn.execute("PRAGMA synchronous=NORMAL")
            with self._transaction():
                self._check_schema()
        except BaseException:
            self._conn.close()
            raise

    def _enable_wal(self) -> None:
        """Switch to WAL (persistent: once per file), waiting here: SQLite reports a racing switch busy at once."""
        deadline = time.monotonic() + _TIMEOUT_S
        while True:
            try:
                self._conn.execute("PRAGMA journal_mode=WAL")
                return
            except sqlite3.OperationalError as e:
                if e.sqlite_errorcode != sqlite3.SQLITE_BUSY or time.monotonic() > deadline:
                    raise
                time.sleep(0.01)

    @contextlib.contextmanager
    def _transaction(self):
        """BEGIN IMMEDIATE takes the write lock first: two processes queue, not fail upgrading a read lock."""
        self._conn.execute("BEGIN IMMEDIATE")
        try:
            yield
        except BaseException:
            self._conn.execute("ROLLBACK")
            raise
        self._conn.execute("COMMIT")

    def _check_schema(self) -> None:
        conn = self._conn
        if not conn.execute("SELECT 1 FROM sqlite_master WHERE type='table' AND name=?", (_TABLE,)).fetchone():
            for statement in filter(str.strip, _SCHEMA.split(";")):
                conn.execute(statement)
            return
        if (version := conn.execute("PRAGMA user_version").fetchone()[0]) != SCHEMA_VERSION:
            age = "an older" if version < SCHEMA_VERSION else "a newer"
            raise SchemaVersionError(f"profile database {self.path} has schema version {version}, written by {age} "
                                     f"egraph-opt; this one reads version {SCHEMA_VERSION} only. Measurements are "
                                     f"cheap to redo: move the file away (or set {ENV_VAR} to another path) and run "
                                     "`egraph-opt profile` again.")
        if "config" not in {row[1] for row in conn.execute(f"PRAGMA table_info({_TABLE})")}:
            conn.execute(f"ALTER TABLE {_TABLE} ADD COLUMN config TEXT")  # a file of before: its rows ran the default

    def add(self, record: Record) -> None:
        self.add_many([record])

    def add_many(self, records: Iterable[Record]) -> None:
        """Append records in one transaction: all are kept or, on error, none."""
        rows = [(r.kernel, r.backend, r.device, r.dtype, r.shape_key, r.runs, r.median_s, r.spread_s,
                 json.dumps(dict(r.versions), sort_keys=True), r.recorded_at,
                 json.dumps(dict(r.config), sort_keys=True) if r.config else None) for r in records]
        with self._transaction():
            self._conn.executemany(f"INSERT INTO {_TABLE} ({_COLUMNS}) VALUES (?,?,?,?,?,?,?,?,?,?,?)", rows)

    def records(self, kernel: str, backend: str, device: str, dtype: str) -> list[Record]:
        """The newest record of each shape of one kernel on one device and dtype."""
        rows = self._conn.execute(f"SELECT {_COLUMNS} FROM {_TABLE} WHERE kernel=? AND backend=? AND device=? AND "
                                  "dtype=? ORDER BY id", (kernel, backend, device, dtype))
        return [_from_row(row) for row in {row[4]: row for row in rows}.values()]  # the newest of each

    def lookup(self, kernel: str, backend: str, device: str, dtype: str,
               shapes: Sequence[Sequence[int]], attrs: Mapping[str, object]) -> Record | None:
        """The newest record of exactly this shape, or None."""
        key = shape_key(shapes, attrs)
        return next((r for r in self.records(kernel, backend, device, dtype) if r.shape_key == key), None)

    def since(self, row_id: int = 0) -> tuple[list[Record], int]:
        """Records after row ``row_id``, oldest first, and the last row's id: to copy them as recorded."""
        rows = self._conn.execute(f"SELECT id, {_COLUMNS} FROM {_TABLE} WHERE id > ? ORDER BY id", (row_id,)).fetchall()
        return [_from_row(row[1:]) for row in rows], rows[-1][0] if rows else row_id

    def export(self, path: str | os.PathLike) -> int:
        """Every record into a new self-contained database at ``path``; how many (the CLI links it in: no overwrite)."""
        if (path := Path(path).expanduser()).exists():
            raise ProfileDBError(f"{path} exists: export writes a new file")
        records = self.since()[0]
        with ProfileDB(path) as out:
            out.add_many(records)
            out._conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
            out._conn.execute("PRAGMA journal_mode=DELETE")  # one file, no -wal beside it
        return len(records)

    def import_file(self, path: str | os.PathLike) -> tuple[int, int]:
        """(added, skipped): another machine's exported records not here, under its machine key (read only there)."""
        path = Path(path).expanduser()
        if reason := ("missing" if not path.is_file() else _foreign_reason(path)[0]):
            raise ProfileDBError(f"cannot import {path}: {reason}, not an egraph-opt profile database")
        with ProfileDB(path) as other:
            records = other.since()[0]
        have = {_identity(r) for r in self.since()[0]}
        new = [r for r in records if _identity(r) not in have]
        self.add_many(new)
        return len(new), len(records) - len(new)

    def count(self) -> int:
        """Number of records, every version of every shape included."""
        return self._conn.execute(f"SELECT count(*) FROM {_TABLE}").fetchone()[0]

    def close(self) -> None:
        self._conn.close()

    def __enter__(self) -> ProfileDB:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
