"""What a deploy shows while it runs: stage k of N, what the stage is doing, its time and the total time.

On a terminal, a live line with a spinner (rich redraws it from its own thread, so it keeps moving while an
export holds the main thread for seconds). Elsewhere (CI logs, pipes), timestamped lines: a start, a
heartbeat every `heartbeat_s` while a stage runs (with the stage's latest message), and an end line."""

from __future__ import annotations

import threading
import time
from types import TracebackType

from rich.console import Console
from rich.markup import escape
from rich.progress import Progress, ProgressColumn, SpinnerColumn, Task, TextColumn, TimeElapsedColumn
from rich.text import Text

from pipeline.core.errors import reason_line
from pipeline.stages.base import Stage
from pipeline.stages.record import StageRecord

STYLES = {"ran": "green", "reused": "cyan", "failed": "red", "skipped": "yellow"}


def clock(seconds: float) -> str:
    seconds = int(seconds)
    return f"{seconds // 3600}:{seconds // 60 % 60:02d}:{seconds % 60:02d}"


class _TotalElapsed(ProgressColumn):
    def __init__(self, started: float):
        super().__init__()
        self.started = started

    def render(self, task: Task) -> Text:
        return Text(f"total {clock(time.monotonic() - self.started)}", style="progress.elapsed")


class StageProgress:
    """Callbacks for Executor.run (on_start, on_done) and RunContext.report, as a context manager."""

    def __init__(self, console: Console, total: int, heartbeat_s: float = 10.0, every_message: bool = False):
        """every_message: plain output gives each message a stage reports a line of its own (-v), instead of
        the latest one in each heartbeat."""
        self.console = console
        self.every_message = every_message
        self.total = total
        self.heartbeat_s = heartbeat_s
        self.started = time.monotonic()
        self._numbers: dict[str, int] = {}  # stage -> its step, given when it starts (or ends unstarted)
        self.live = console.is_terminal
        self._current: tuple[str, float] | None = None  # running stage, its start
        self._background: dict[str, float] = {}  # background stages still running, their start
        self._tasks: dict[str, int] = {}  # live display: each background stage's own line
        self._last_message: str | None = None
        self._task: int | None = None
        self._stop = threading.Event()
        self._progress = Progress(
            SpinnerColumn(),
            TextColumn("{task.description}"),
            TimeElapsedColumn(),
            _TotalElapsed(self.started),
            console=console,
            transient=True,
            refresh_per_second=8,
        )
        self._beat = threading.Thread(target=self._heartbeat, name="progress-heartbeat", daemon=True)

    def __enter__(self) -> StageProgress:
        if self.live:
            self._progress.start()
        else:
            self._beat.start()
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self._stop.set()
        if self.live:
            self._progress.stop()
        elif self._beat.is_alive():
            self._beat.join(timeout=1)

    # ------------------------------------------------------------ executor callbacks

    def on_start(self, stage: Stage, why: str) -> None:
        if stage.background:
            self._background[stage.name] = time.monotonic()
            text = f"{self._step(stage.name)} {stage.name}: started in the background ({why})"
            if self.live:
                self._tasks[stage.name] = self._progress.add_task(escape(text), total=None)
            else:
                self._line(text)
            return
        self._current = (stage.name, time.monotonic())
        self._last_message = None
        if self.live:
            description = escape(f"{self._step(stage.name)} {stage.name}: starting ({why})")
            self._task = self._progress.add_task(description, total=None)
        else:
            self._line(f"{self._step(stage.name)} {stage.name}: started ({why})")

    def report(self, message: str) -> None:
        """A stage's own progress text: the live line shows it at once; plain output shows the latest one
        in each heartbeat line (a benchmark reports every window: too many lines for a log)."""
        if self._current is None:
            return
        self._last_message = message
        step = self._step(self._current[0])
        if self.live and self._task is not None:
            self._progress.update(self._task, description=escape(f"{step} {message}"))
        if self.every_message:
            if self.live:  # above the live line, which keeps the latest
                self._progress.console.print(escape(f"{step} {message}"), highlight=False, markup=True)
            else:
                self._line(f"{step} {message}")

    def on_done(self, record: StageRecord) -> None:
        step = self._step(record.name)
        if record.name in self._background:
            del self._background[record.name]
            if record.name in self._tasks:
                self._progress.remove_task(self._tasks.pop(record.name))
        else:
            self._current = None
            if self._task is not None:
                self._progress.remove_task(self._task)
                self._task = None
        style = STYLES[record.status]
        extra = (
            f" from {record.reused_from}" if record.reused_from else f"  ({record.why})" if record.why else ""
        )
        error = f"  {reason_line(record.error, 160)}" if record.error else ""
        text = (
            f"{step} [{style}]{record.status:>7}[/{style}] {record.name:<24} {record.duration_s:7.1f} s"
            f"  total {clock(time.monotonic() - self.started)}{escape(extra + error)}"
        )
        if self.live:
            self._progress.console.print(text, highlight=False, markup=True)
        else:
            self._line(text, markup=True)

    # ------------------------------------------------------------ internals

    def _step(self, name: str) -> str:
        """A stage's step number, given once: a front stage keeps its number while a background stage ends
        beside it."""
        number = self._numbers.setdefault(name, len(self._numbers) + 1)
        return f"[{min(number, self.total)}/{self.total}]"

    def _line(self, text: str, markup: bool = False) -> None:
        stamp = time.strftime("%Y-%m-%dT%H:%M:%S")
        self.console.print(f"{stamp} {text}", highlight=False, markup=markup, soft_wrap=True)  # one line each

    def _heartbeat(self) -> None:
        while not self._stop.wait(self.heartbeat_s):
            current, message, now = self._current, self._last_message, time.monotonic()
            behind = "".join(
                f"; {name} in the background {clock(now - since)}"
                for name, since in list(self._background.items())
            )
            if current is not None:
                name, since = current
                doing = f": {message}" if message else ""
                self._line(
                    f"{self._step(name)} {name} running {clock(now - since)} (total {clock(now - self.started)}){doing}{behind}"
                )
            elif behind:
                self._line(f"waiting (total {clock(now - self.started)}){behind}")
