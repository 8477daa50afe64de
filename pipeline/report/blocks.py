"""The neutral document the sign-off report is built as: sections of paragraphs, tables, lists, images and
code. Markdown and HTML render this one structure, so the two pages can never tell different stories."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class Cell:
    """A table cell with a tone: info (grey: informational, never gates), bad, good."""

    text: str
    tone: str = ""


Text = str | Cell


def text_of(value: Text) -> str:
    return value.text if isinstance(value, Cell) else value


@dataclass(frozen=True)
class Para:
    text: str
    strong: bool = False
    tone: str = ""  # "" | good | bad | note


@dataclass(frozen=True)
class Table:
    headers: list[str]
    rows: list[list[Text]]
    tones: list[str] = field(default_factory=list)  # per row: "" | bad | warn | winner


@dataclass(frozen=True)
class Bullets:
    items: list[str]
    tone: str = ""  # "" | bad | warn


@dataclass(frozen=True)
class Image:
    src: str  # relative to reports/, where the pages live
    alt: str


@dataclass(frozen=True)
class Code:
    caption: str
    text: str


@dataclass(frozen=True)
class Card:
    """The first screen: the verdict (signed_off · provisional · not_signed_off), then (label, value) facts
    and how to load what ships."""

    state: str
    verdict: str
    facts: list[tuple[str, str]]
    snippet: str | None = None


Block = Para | Table | Bullets | Image | Code | Card


@dataclass(frozen=True)
class Section:
    title: str
    blocks: list[Block]
    folded: bool = False  # the record: there for whoever needs it, out of the reader's way


@dataclass(frozen=True)
class Document:
    title: str
    subtitle: str
    signed_off: bool
    sections: list[Section]
