"""Where the pipeline calls the user's code (a model's module, factory and forward), `SystemExit` and a
`KeyboardInterrupt` the code raised itself become `UserCodeExit`, an ordinary exception: the caller reports it
as it reports any other failure of that code, and the tool never ends silently with the model's exit code.

A real Ctrl-C must still stop the deploy. Both arrive as KeyboardInterrupt; they are told apart by the signal:
while `interrupts_watched` is active (the CLI runs every command under it), SIGINT is recorded before the
KeyboardInterrupt is raised, so a KeyboardInterrupt without a recorded SIGINT was raised by code. A child
process that runs the model (pre-flight's check, a lane's worker) ignores SIGINT (`ignore_interrupts`): its
parent owns Ctrl-C and kills it, so there every KeyboardInterrupt is code's. Where nobody watches (SIGINT has
another handler, or the pipeline is used as a library) the two cannot be told apart, and every
KeyboardInterrupt is taken as a Ctrl-C, as before."""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Iterator
from types import FrameType

from pipeline.core.errors import PipelineError


class UserCodeExit(Exception):
    """The user's code called sys.exit or raised KeyboardInterrupt itself (no Ctrl-C reached the tool)."""


class StoppedByModel(PipelineError):
    """UserCodeExit in a stage whose failure stops the run (validation, the benchmark): the model's doing, so
    a user error (exit 2) and nothing published, not a bug of the pipeline's (exit 3)."""

    def __init__(self, stage: str, exc: UserCodeExit):
        super().__init__(
            f"model: {exc} in the {stage} stage, whose failure stops the run: nothing was published"
        )


class _Watch:
    """Whether SIGINT is being recorded, and whether it arrived (process-wide, as signals are)."""

    active = False
    signalled = threading.Event()


def _record_sigint(signum: int, frame: FrameType | None) -> None:
    _Watch.signalled.set()
    signal.default_int_handler(signum, frame)  # KeyboardInterrupt, as Python's own handler raises it


@contextlib.contextmanager
def interrupts_watched() -> Iterator[None]:
    """Record SIGINT while the block runs (Ctrl-C still raises KeyboardInterrupt where it did). Only from the
    main thread, and only over Python's default handler (or none, where SIGINT is ignored): a handler someone
    else installed is left alone."""
    main = threading.current_thread() is threading.main_thread()
    handler = signal.getsignal(signal.SIGINT)
    owned = main and handler is signal.default_int_handler
    # started with SIGINT ignored (in the background, under nohup): no Ctrl-C can reach this process, so every
    # KeyboardInterrupt in it is code's
    ignored = main and handler is signal.SIG_IGN
    if not (owned or ignored):
        yield
        return
    _Watch.signalled.clear()
    if owned:
        signal.signal(signal.SIGINT, _record_sigint)
    _Watch.active = True
    try:
        yield
    finally:
        _Watch.active = False
        if owned:
            signal.signal(signal.SIGINT, signal.default_int_handler)


def ignore_interrupts() -> None:
    """For a child process whose parent owns Ctrl-C (and kills the child when it stops): SIGINT is ignored
    here, so every KeyboardInterrupt in this process was raised by code."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    _Watch.signalled.clear()
    _Watch.active = True


def interrupted_by_signal() -> bool:
    """True when a KeyboardInterrupt should be taken as a Ctrl-C: SIGINT arrived, or nobody is watching."""
    return not _Watch.active or _Watch.signalled.is_set()


def as_user_exit(exc: BaseException) -> UserCodeExit | None:
    """`exc` as the user code's own exit, or None when it is not one (a Ctrl-C, or any other exception)."""
    if isinstance(exc, SystemExit):
        code = "" if exc.code is None else repr(exc.code)
        return UserCodeExit(f"the model's code called sys.exit({code})")
    if isinstance(exc, KeyboardInterrupt) and not interrupted_by_signal():
        return UserCodeExit("the model's code raised KeyboardInterrupt (no Ctrl-C reached the pipeline)")
    return None


@contextlib.contextmanager
def contained() -> Iterator[None]:
    """Run user code: its own SystemExit or KeyboardInterrupt leaves the block as UserCodeExit (its cause
    kept), a Ctrl-C as the KeyboardInterrupt it is."""
    try:
        yield
    except (SystemExit, KeyboardInterrupt) as exc:
        fault = as_user_exit(exc)
        if fault is None:
            raise
        raise fault from exc
