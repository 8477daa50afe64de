"""Reading what earlier deploys stored: manifest.json, winner.json, reports/speed.json, reports/accuracy.json and
stages.json, through one loader. Stored data is never trusted: a file may be truncated, not UTF-8, nested
200,000 deep, gigabytes long, or valid JSON of the wrong shape (`[1]` where a winner belongs), and every
command that reads an old version (list, compare, plan, deploy's "changes since", verify) must then say
"damaged" and name the file, never crash. So reading is bounded (size, then depth) and each kind of file is
checked for the shape its readers rely on (pydantic models that allow extra keys: the contract lets fields be
added)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, ValidationError

MAX_BYTES = 256 * 1024 * 1024  # the largest report a deploy writes is a few MB; a manifest a few hundred KB
MAX_DEPTH = 64  # the deepest contract file nests about 10 levels (a resolved recipe inside a manifest)


class Damaged(Exception):
    """A stored file that cannot be read as what it should be; `path` names it, `reason` says why."""

    def __init__(self, path: Path, reason: str):
        super().__init__(f"{path}: damaged ({reason})")
        self.path = path
        self.reason = reason


class _Loose(BaseModel):
    model_config = ConfigDict(extra="allow")


class _Entry(_Loose):
    path: str
    sha256: str


class Manifest(_Loose):
    version: str
    signed_off: bool
    artifacts: list[_Entry]
    files: list[_Entry]
    created: str | None = None
    headline: str | None = None
    failed: list[dict[str, Any]] = []
    provisional: bool = False


class Winner(_Loose):
    artifact: str
    runtime: str
    io: str = "host"
    value: float | None = None
    unit: str | None = "ms"
    objective: dict[str, Any] = {}


class _SpeedRow(_Loose):
    artifact: str
    runtime: str
    io: str = "host"
    batch: int
    shapes: dict[str, list[int]] = {}


class Speed(_Loose):
    results: list[_SpeedRow] = []
    not_run: list[dict[str, Any]] = []
    conditions: dict[str, Any] = {}


class _AccuracyEntry(_Loose):
    passed: bool
    checks: list[dict[str, Any]] = []
    runtimes: dict[str, dict[str, Any]] = {}


class Accuracy(_Loose):
    artifacts: dict[str, _AccuracyEntry] = {}
    not_run: list[dict[str, Any]] = []


class RunRecord(_Loose):
    stages: list[dict[str, Any]]


SHAPES: dict[str, type[_Loose]] = {
    "manifest.json": Manifest,
    "winner.json": Winner,
    "speed.json": Speed,
    "accuracy.json": Accuracy,
    "stages.json": RunRecord,
}


def load_json(path: Path) -> Any:
    """The parsed JSON of a stored file, bounded in size and depth; raises Damaged (FileNotFoundError when
    the file is absent, which is no damage by itself)."""
    try:
        size = path.stat().st_size
    except FileNotFoundError:
        raise
    except OSError as exc:
        raise Damaged(path, f"cannot be read: {exc.strerror}") from None
    if not path.is_file():
        raise Damaged(path, "not a regular file")
    if size > MAX_BYTES:
        raise Damaged(path, f"{size} bytes, more than any report holds ({MAX_BYTES})")
    try:
        text = path.read_bytes().decode("utf-8")
    except UnicodeDecodeError as exc:
        raise Damaged(path, f"not UTF-8 at byte {exc.start}") from None
    except OSError as exc:
        raise Damaged(path, f"cannot be read: {exc.strerror}") from None
    try:
        data = json.loads(text)
    except RecursionError:
        raise Damaged(path, f"nested deeper than {MAX_DEPTH} levels") from None
    except ValueError as exc:
        raise Damaged(path, f"not JSON: {str(exc).splitlines()[0][:120]}") from None
    if _depth(data) > MAX_DEPTH:
        raise Damaged(path, f"nested deeper than {MAX_DEPTH} levels")
    return data


def read_stored(path: Path) -> dict[str, Any] | None:
    """A contract file (manifest.json, winner.json, speed.json, accuracy.json, stages.json) as a dict of the
    shape its readers rely on; None when absent; Damaged when unreadable or of another shape."""
    try:
        data = load_json(path)
    except FileNotFoundError:
        return None
    shape = SHAPES.get(path.name)
    if shape is not None:
        try:
            shape.model_validate(data)
        except ValidationError as exc:
            first = exc.errors()[0]
            where = ".".join(str(p) for p in first["loc"]) or "the document"
            raise Damaged(path, f"{where}: {first['msg']}") from None
    if not isinstance(data, dict):
        raise Damaged(path, f"a JSON {type(data).__name__}, not an object")
    return data


def read_or_none(path: Path, warn: Any = None) -> dict[str, Any] | None:
    """read_stored, with a damaged file reported through `warn` (when given) and read as absent: for readers
    that can do without it (a previous version's history)."""
    try:
        return read_stored(path)
    except Damaged as exc:
        if warn is not None:
            warn(f"{exc}; ignored")
        return None


def _depth(data: Any) -> int:
    """How deep lists and objects nest (iteratively: the depth itself is what may be hostile)."""
    deepest, stack = 0, [(data, 1)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, dict | list):
            deepest = max(deepest, depth)
            if depth > MAX_DEPTH:
                return depth
            children = item.values() if isinstance(item, dict) else item
            stack.extend((child, depth + 1) for child in children)
    return deepest
