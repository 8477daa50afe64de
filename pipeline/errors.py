"""Two error families: user errors (one line each, exit 2) and everything else (a bug: traceback, exit 3)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Problem:
    """One user-facing problem, already located: `where` is `file:line:col` or `--set key=value`."""

    where: str
    key: str
    message: str

    def __str__(self) -> str:
        return f"{self.where}: {self.key}: {self.message}" if self.key else f"{self.where}: {self.message}"


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
        return [str(self.message)]


class RecipeError(PipelineError):
    """The recipe (file or --set overrides) is invalid or asks for something this machine lacks."""


class LockHeldError(PipelineError):
    """Another deploy of the same recipe name holds the lock."""


class StageError(Exception):
    """A stage failed in a way its variant owns (unsupported op, parser error): recorded, the run goes on.
    `details` land in the stage's record (e.g. that a trace disagreed with eager at some shape)."""

    def __init__(self, message: str, details: dict | None = None):
        super().__init__(message)
        self.details = dict(details or {})
