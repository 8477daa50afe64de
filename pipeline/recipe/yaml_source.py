"""Reading a recipe's YAML so that every problem has a place: line and column of every key and value (an
alias's data placed where the alias stands, merged keys under the mapping that merges them), the keys a
mapping repeats, and bytes that are not UTF-8 located by line and column rather than a byte offset.

A recipe is small and a tree, so what a hostile file could make of YAML is bounded while it is read, before
anything grows: only a regular file of at most MAX_RECIPE_BYTES is read (a FIFO or a device would block or
never end), nesting stops at MAX_DEPTH, an alias that refers to the node holding it is refused, and aliases
may add at most MAX_ALIAS_NODES nodes to the document in all (ten lines of nested aliases otherwise expand to
billions)."""

from __future__ import annotations

import copy
import os
import stat
from pathlib import Path

import yaml

from pipeline.core.errors import PipelineError, Problem, RecipeError
from pipeline.recipe.keys import dotted

Loc = tuple

MAX_RECIPE_BYTES = 1 << 20
"""1 MiB: the largest shipped recipe is 4 KB; a file 250 times that is no recipe, and reading it is not free."""
MAX_ALIAS_NODES = 500
"""Nodes that aliases may add to a document, all aliases together, counted before each one is expanded. The
largest shipped recipe has 234 nodes in all, and an alias repeats a part of a recipe (a dims block, a
tolerance), so 500 leaves room for any honest use and none for a bomb (nine aliases of nine aliases of ...)."""
MAX_DEPTH = 64
"""Levels of nesting: a recipe's deepest key is six levels down; composing is recursive, so ten thousand
brackets would otherwise end in a RecursionError."""


class YamlLimit(yaml.YAMLError):
    """YAML that a recipe has no use for and that would cost time or memory to read (a bomb): located at the
    alias or the node where the limit was crossed, with the key path it stands at."""

    def __init__(self, mark: yaml.Mark, loc: Loc, message: str):
        super().__init__(message)
        self.mark, self.loc, self.message = mark, loc, message


class _BoundedLoader(yaml.SafeLoader):
    """SafeLoader that knows, while composing, the key path of each node and how many nodes each node stands
    for once its aliases are expanded (`node.expanded`), so that an alias is judged before anything expands
    it (composing shares the anchor's node; constructing, walking and dumping the data would not)."""

    def __init__(self, stream: str):
        super().__init__(stream)
        self._path: list[Loc] = []
        self._aliased = 0

    def compose_node(self, parent: yaml.Node | None, index: object) -> yaml.Node:
        loc = self._loc(parent, index)
        if self.check_event(yaml.AliasEvent):
            self._count_alias(loc)
            return super().compose_node(parent, index)
        if len(self._path) >= MAX_DEPTH:
            raise YamlLimit(self.peek_event().start_mark, loc, f"nested deeper than {MAX_DEPTH} levels")
        self._path.append(loc)
        try:
            node = super().compose_node(parent, index)
        finally:
            self._path.pop()
        node.expanded = 1 + sum(child.expanded for child in _children(node))
        return node

    def _loc(self, parent: yaml.Node | None, index: object) -> Loc:
        if parent is None or not self._path:
            return ()
        here = self._path[-1]
        if isinstance(index, yaml.ScalarNode):
            return (*here, index.value)
        return (*here, index) if isinstance(index, int) else here

    def _count_alias(self, loc: Loc) -> None:
        event = self.peek_event()
        node = self.anchors.get(event.anchor)
        if node is None:
            return  # an undefined alias: the composer's own error says so
        size = getattr(node, "expanded", None)
        if size is None:  # its anchor's node is still being composed: it holds the alias
            raise YamlLimit(
                event.start_mark,
                loc,
                f"alias *{event.anchor} refers to a node that holds it (a recursive alias); a recipe is a tree",
            )
        self._aliased += size
        if self._aliased > MAX_ALIAS_NODES:
            raise YamlLimit(
                event.start_mark,
                loc,
                f"aliases expand to more than {MAX_ALIAS_NODES} nodes (*{event.anchor} alone is {size}); "
                "write the data out instead of nesting aliases",
            )


def _children(node: yaml.Node) -> list[yaml.Node]:
    if isinstance(node, yaml.MappingNode):
        return [part for pair in node.value for part in pair]
    return list(node.value) if isinstance(node, yaml.SequenceNode) else []


class _AliasLoader(_BoundedLoader):
    """Composes like SafeLoader, but an alias yields a copy of its anchor's node that remembers where the
    alias stands: a problem in aliased data is reported where the alias uses it, not at the anchor. The copy
    has its own list of items, as constructing a mapping folds its merge keys (`<<`) into that list in place."""

    def compose_node(self, parent: yaml.Node | None, index: object) -> yaml.Node:
        if not self.check_event(yaml.AliasEvent):
            return super().compose_node(parent, index)
        mark = self.peek_event().start_mark
        node = copy.copy(super().compose_node(parent, index))
        if isinstance(node, yaml.CollectionNode):
            node.value = list(node.value)
        node.alias_mark = mark
        return node


def parse(text: str) -> tuple[object, Positions]:
    """The document's data and the places of its keys and values, from one bounded composition (the places
    are taken before constructing, which folds merge keys into their mappings)."""
    loader = _AliasLoader(text)
    try:
        node = loader.get_single_node()
        positions = Positions(node)
        return (loader.construct_document(node) if node is not None else None), positions
    finally:
        loader.dispose()


def parse_value(text: str) -> object:
    """One value (a --set override's), read within the same bounds as a recipe file."""
    loader = _BoundedLoader(text)
    try:
        return loader.get_single_data()
    finally:
        loader.dispose()


class Positions:
    """1-based (line, col) of every value and key in a YAML document, by key path; and the keys that a
    mapping repeats (YAML loaders silently keep the last one)."""

    def __init__(self, node: yaml.Node | None):
        self.values: dict[Loc, tuple[int, int]] = {}
        self.keys: dict[Loc, tuple[int, int]] = {}
        self.duplicates: list[tuple[Loc, tuple[int, int], int]] = []  # key path, its place, first line
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


def not_a_file(path: Path) -> str | None:
    """What a path is when it is not a regular file, told from its status alone (opening a FIFO blocks until
    a writer comes, and a device may never end or act when opened); None for a file or for nothing there."""
    try:
        mode = path.stat().st_mode
    except OSError:
        return None
    return _kind(mode)


def _kind(mode: int) -> str | None:
    if stat.S_ISREG(mode):
        return None
    if stat.S_ISDIR(mode):
        return "is a directory; a recipe is a YAML file"
    if stat.S_ISFIFO(mode):
        return "is a FIFO, not a file"
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return "is a device, not a file"
    return "is a socket, not a file" if stat.S_ISSOCK(mode) else "is not a regular file"


def _read_bounded(path: Path, shown: str) -> bytes:
    """At most MAX_RECIPE_BYTES of a regular file: opened without blocking and checked again once open, so a
    path swapped for a FIFO in between cannot hang the read."""
    kind = not_a_file(path)
    if kind is None:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
        with os.fdopen(fd, "rb") as stream:
            kind = _kind(os.fstat(fd).st_mode)
            data = b"" if kind else stream.read(MAX_RECIPE_BYTES + 1)
    if kind:
        raise RecipeError(problems=[Problem(shown, "", kind)])
    if len(data) > MAX_RECIPE_BYTES:
        raise RecipeError(
            problems=[
                Problem(
                    shown, "", f"is larger than {MAX_RECIPE_BYTES >> 10} KiB; a recipe is a small YAML file"
                )
            ]
        )
    return data


def read_text(path: Path, shown: str, key: str = "") -> str:
    """UTF-8 text (a BOM is allowed); a byte that is not UTF-8 is a problem located at its line and column."""
    data = _read_bounded(path, shown)
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


def read_mapping(
    path: Path, error: type[PipelineError], unreadable: str, not_mapping: str
) -> tuple[dict, Positions, str]:
    """A YAML file that must be a mapping (a recipe, a fleet file), with the place of every key, and the path
    as problems show it; any failure is `error` with one located problem, `unreadable` or `not_mapping` its
    words for an unreadable file or another kind of document."""
    shown = str(path)
    try:
        text = read_text(path, shown, "(file)")
    except OSError as exc:
        raise error(problems=[Problem(shown, "", f"{unreadable}: {exc.strerror}")]) from None
    try:
        raw, positions = parse(text)
    except yaml.YAMLError as exc:
        raise error(problems=[yaml_problem(exc, shown, text)]) from None
    if not isinstance(raw, dict):
        raise error(problems=[Problem(f"{shown}:1:1", "(root)", not_mapping)])
    return raw, positions, shown


def yaml_problem(exc: yaml.YAMLError, shown: str, text: str) -> Problem:
    """A YAML syntax problem at its line and column (a reader error knows only a character offset); a bound
    crossed at the key path where it was crossed."""
    if isinstance(exc, YamlLimit):
        return Problem(
            f"{shown}:{exc.mark.line + 1}:{exc.mark.column + 1}", dotted(exc.loc) or "(root)", exc.message
        )
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
