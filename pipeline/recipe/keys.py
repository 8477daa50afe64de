"""Dotted key paths, as problems name them and --set takes them: 'benchmark.batch_sizes[2]'."""

from __future__ import annotations

import re


def dotted(loc: tuple) -> str:
    """('benchmark', 'batch_sizes', 2) -> 'benchmark.batch_sizes[2]'."""
    out = ""
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out


def split_dotted(key: str) -> list[str | int]:
    """Inverse of dotted() for --set keys: 'a.b[2].c' -> ['a', 'b', 2, 'c']."""
    parts: list[str | int] = []
    for token in key.split("."):
        m = re.fullmatch(r"([^\[\]]*)((?:\[\d+\])*)", token)
        if not m or (not m.group(1) and not m.group(2)):
            raise ValueError(f"not a dotted key: {key!r}")
        if m.group(1):
            parts.append(m.group(1))
        parts += [int(i) for i in re.findall(r"\[(\d+)\]", m.group(2))]
    return parts
