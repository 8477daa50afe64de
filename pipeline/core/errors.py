"""Two error families: user errors (one line each, exit 2) and everything else (a bug: traceback, exit 3)."""

from __future__ import annotations

import difflib
import re
import unicodedata
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

LOCATION = re.compile(r"^(?P<file>.+):(?P<line>\d+):(?P<column>\d+)$")
SUGGESTION = re.compile(r"did you mean '([^']+)'")


def did_you_mean(word: str, choices: Iterable[str]) -> str | None:
    """The closest known name to a mistyped one, when one is close enough to be the likely intent."""
    close = difflib.get_close_matches(word, list(choices), n=1, cutoff=0.6)
    return close[0] if close else None


ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")  # a terminal's colour and cursor codes (torch.export's messages)


# ONNX Runtime's C++ throw sites ("/onnxruntime_src/….cc:154 std::conditional_t<…> onnxruntime::CudaCall(…)
# [with …]"), and the GPU, host and source fields of its CUDA failures: what fills a report's line before the
# reason ("CUDA failure 900: operation not permitted when stream is capturing ; expr=…")
ORT_FRAME = re.compile(r"/onnxruntime_src/\S+:\d+ (?:[^\[\n]*?\) \[with [^\]\n]*\] ?)?")
ORT_FIELDS = re.compile(r"[ \t]*;[ \t]*(?:GPU|hostname|file|line)=[^;\n]*")


def plain(text: str) -> str:
    """A tool's message as a report or a record quotes it: without terminal colour codes, and without ONNX
    Runtime's C++ throw sites, which would fill the quoted line before its reason."""
    return ORT_FIELDS.sub("", ORT_FRAME.sub("", ANSI.sub("", text)))


# A first line that only says where an error happened: its reason is the message's last line
WRAPPER_LINES = ("The following operation failed in the TorchScript interpreter.",)


def first_line(text: object, limit: int = 300) -> str:
    """An error's reason in one line, as a report lists it: its first line, or for an error whose first line only
    wraps it (TorchScript's interpreter) its last, where the reason is; at most `limit` characters."""
    lines = _lines(text)
    if not lines:
        return ""
    line = lines[0]
    if len(lines) > 1 and line.endswith(WRAPPER_LINES):
        kind = f"{line.split(': ', 1)[0]} " if ": " in line else ""
        line = f"{kind}in the TorchScript interpreter: {lines[-1]}"
    elif len(lines) > 1 and re.fullmatch(r"[\w.]+:", line):  # only the exception's type: its message follows
        line = f"{line} {lines[1]}"
    return _clipped(line, limit)


PYTHON_TRACEBACK = "Traceback (most recent call last):"


def reason_line(text: object, limit: int = 300) -> str:
    """A failure's reason on one line, as the console and the sign-off list it: its lines joined, since the line
    after a break is often the reason's subject (onnx's checker names the node on the next line: "input
    'weight_rows' of node:" alone says nothing); a TorchScript wrapper line is replaced by the reason as in
    `first_line`, and a Python traceback is no part of the reason (after a message, it is left out; alone,
    its last line is the reason). At most `limit` characters: the record keeps the whole text."""
    lines = _lines(text)
    if len(lines) > 1 and lines[0].endswith(WRAPPER_LINES):
        return first_line(text, limit)
    cut = next((i for i, line in enumerate(lines) if line.startswith(PYTHON_TRACEBACK)), len(lines))
    return _clipped(" ".join(lines[:cut] or lines[-1:]), limit)


def _lines(text: object) -> list[str]:
    """An error's non-blank lines, stripped, without colour codes or ONNX Runtime's frames."""
    return [line.strip() for line in plain(str(text or "")).strip().splitlines() if line.strip()]


def _clipped(line: str, limit: int) -> str:
    return line if len(line) <= limit else line[: limit - 1] + "…"


def one_line(text: str) -> str:
    """Control characters (a newline in a --set value, in a path, in a quoted value) written as escapes, and
    terminal colour codes dropped: a problem is one line on stderr, whatever the user's text held."""
    return "".join(
        ch.encode("unicode_escape").decode("ascii") if unicodedata.category(ch) == "Cc" else ch
        for ch in plain(text)
    )


@dataclass(frozen=True)
class Problem:
    """One user-facing problem, already located: `where` is `file:line:col` or `--set key=value`."""

    where: str
    key: str
    message: str

    def __str__(self) -> str:
        text = f"{self.where}: {self.key}: {self.message}" if self.key else f"{self.where}: {self.message}"
        return one_line(text)

    def located(self) -> dict[str, Any]:
        """The problem for a program (`--json`): file, line and column where it is (line and column null for
        an override or a whole file, file null for an override), the recipe key, the message, and the
        suggestion a "did you mean" names."""
        found = LOCATION.match(self.where)
        override = self.where.startswith("--set ")
        suggestion = SUGGESTION.search(self.message)
        return {
            "file": None if override else (found.group("file") if found else self.where),
            "line": int(found.group("line")) if found else None,
            "column": int(found.group("column")) if found else None,
            "key": self.key or None,
            "message": one_line(self.message),
            "suggestion": suggestion.group(1) if suggestion else None,
            "override": self.where.removeprefix("--set ") if override else None,
        }


class PipelineError(Exception):
    """A user-facing error: printed as one line per problem, exit code 2, no traceback."""

    exit_code = 2

    def __init__(self, message: str | None = None, problems: list[Problem] | None = None):
        self.problems = list(problems or [])
        self.message = message
        super().__init__(message or "; ".join(str(p) for p in self.problems))

    def lines(self, limit: int = 20) -> list[str]:
        if self.problems:
            return [str(p) for p in self.problems[:limit]]
        return [one_line(str(self.message))]


class InternalError(PipelineError):
    """A failure of the pipeline's own making that it can say in one line (a server refusing the configuration
    the pipeline wrote): no traceback, but exit 3, a bug, not the user's error."""

    exit_code = 3

    def lines(self, limit: int = 20) -> list[str]:
        return [*super().lines(limit), "internal error: this is a bug in the pipeline (exit 3)"]


class RecipeError(PipelineError):
    """The recipe (file or --set overrides) is invalid or asks for something this machine lacks."""


class LockHeldError(PipelineError):
    """Another deploy of the same recipe name holds the lock."""


class Interrupted(PipelineError):
    """The run stopped before publishing for a reason that is neither the recipe's nor a variant's: files it
    made vanished from its work folder (a cleaner, another process, a full reset of the folder). Nothing is
    published and nothing is recorded as failed, so the next deploy builds it again (exit 130, as Ctrl-C)."""

    exit_code = 130


class StageError(Exception):
    """A stage failed in a way its variant owns (unsupported op, parser error): recorded, the run goes on.
    `details` land in the stage's record (e.g. that a trace disagreed with eager at some shape)."""

    def __init__(self, message: str, details: dict | None = None):
        super().__init__(message)
        self.details = dict(details or {})
