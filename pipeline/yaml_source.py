"""Reading a recipe's YAML so that every problem has a place: line and column of every key and value (an
alias's data placed where the alias stands, merged keys under the mapping that merges them), the keys a
mapping repeats, and bytes that are not UTF-8 located by line and column rather than a byte offset."""

from __future__ import annotations

import copy
from pathlib import Path

import yaml

from pipeline.errors import Problem, RecipeError

Loc = tuple


class _AliasLoader(yaml.SafeLoader):
    """Composes like SafeLoader, but an alias yields a copy of its anchor's node that remembers where the
    alias stands: a problem in aliased data is reported where the alias uses it, not at the anchor."""

    def compose_node(self, parent: yaml.Node | None, index: object) -> yaml.Node:
        if not self.check_event(yaml.AliasEvent):
            return super().compose_node(parent, index)
        mark = self.peek_event().start_mark
        node = copy.copy(super().compose_node(parent, index))
        node.alias_mark = mark
        return node


class Positions:
    """1-based (line, col) of every value and key in a YAML document, by key path; and the keys that a
    mapping repeats (YAML loaders silently keep the last one)."""

    def __init__(self, text: str):
        self.values: dict[Loc, tuple[int, int]] = {}
        self.keys: dict[Loc, tuple[int, int]] = {}
        self.duplicates: list[tuple[Loc, tuple[int, int], int]] = []  # key path, its place, first line
        node = yaml.compose(text, Loader=_AliasLoader)
        if node is not None:
            self._walk(node, (), None, False)

    def _set(self, table: dict, loc: Loc, mark: yaml.Mark, merged: bool) -> None:
        place = (mark.line + 1, mark.column + 1)
        if merged:
            table.setdefault(loc, place)
        else:
            table[loc] = place

    def _walk(self, node: yaml.Node, loc: Loc, alias: yaml.Mark | None, merged: bool) -> None:
        alias = alias or getattr(node, "alias_mark", None)
        self._set(self.values, loc, alias or node.start_mark, merged)
        if isinstance(node, yaml.MappingNode):
            seen: dict[object, int] = {}
            merges = []
            for key_node, value_node in node.value:
                if key_node.tag == "tag:yaml.org,2002:merge":
                    merges.append(value_node)
                    continue
                key = key_node.value if isinstance(key_node, yaml.ScalarNode) else None
                child = (*loc, key)
                mark = alias or key_node.start_mark
                if key in seen and alias is None and not merged:
                    self.duplicates.append((child, (mark.line + 1, mark.column + 1), seen[key]))
                seen.setdefault(key, mark.line + 1)
                self._set(self.keys, child, mark, merged)
                self._walk(value_node, child, alias, merged)
            for source in merges:  # merged keys (`<<: *base`) never override the mapping's own keys
                for part in source.value if isinstance(source, yaml.SequenceNode) else [source]:
                    inner = alias or getattr(part, "alias_mark", None)
                    if isinstance(part, yaml.MappingNode):
                        for key_node, value_node in part.value:
                            child = (*loc, key_node.value)
                            self._set(self.keys, child, inner or key_node.start_mark, True)
                            self._walk(value_node, child, inner, True)
        elif isinstance(node, yaml.SequenceNode):
            for i, item in enumerate(node.value):
                self._walk(item, (*loc, i), alias, merged)

    def find(self, loc: Loc, key: bool = False) -> tuple[int, int]:
        table = self.keys if key else self.values
        if loc in table:
            return table[loc]
        while loc:
            loc = loc[:-1]
            if loc in self.values:
                return self.values[loc]
        return (1, 1)


def line_col(data: bytes, offset: int) -> tuple[int, int]:
    """1-based line and column (in characters) of a byte offset into UTF-8 text valid before it."""
    start = data.rfind(b"\n", 0, offset) + 1
    return data.count(b"\n", 0, offset) + 1, len(data[start:offset].decode("utf-8", "replace")) + 1


def read_text(path: Path, shown: str, key: str = "") -> str:
    """UTF-8 text (a BOM is allowed); a byte that is not UTF-8 is a problem located at its line and column."""
    data = path.read_bytes()
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        line, col = line_col(data, exc.start)
        raise RecipeError(
            problems=[
                Problem(
                    f"{shown}:{line}:{col}",
                    key,
                    f"not UTF-8 text: byte 0x{data[exc.start]:02x} at byte offset {exc.start} ({exc.reason})",
                )
            ]
        ) from None


def yaml_problem(exc: yaml.YAMLError, shown: str, text: str) -> Problem:
    """A YAML syntax problem at its line and column (a reader error knows only a character offset)."""
    mark = getattr(exc, "problem_mark", None)
    if mark is not None:
        where = f"{shown}:{mark.line + 1}:{mark.column + 1}"
    elif isinstance(exc, yaml.reader.ReaderError):
        line, col = line_col(text.encode("utf-8"), len(text[: exc.position].encode("utf-8")))
        where = f"{shown}:{line}:{col}"
    else:
        where = shown
    if isinstance(exc, yaml.reader.ReaderError):
        problem = f"character #x{exc.character:04x} is not allowed in YAML"
    else:
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
    return Problem(where, "(yaml)", f"invalid YAML: {problem}")
