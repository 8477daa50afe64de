"""What exporters, converters and quantizers print, log and warn, sent to a stage's log file: the live display
shows the deploy's progress, and a tool's console output is the stage's record, kept with its artifacts."""

from __future__ import annotations

import contextlib
import io
import logging
import sys
import warnings
from collections.abc import Iterator
from pathlib import Path


@contextlib.contextmanager
def captured(log_path: Path) -> Iterator[None]:
    """Send what exporters, converters and quantizers print, log and warn (torch.onnx and ONNX Runtime's tools
    do all three) to the stage's log file instead of the live display. torch's loggers do not propagate and
    carry their own stderr handlers, so those handlers are swapped out for the duration. One at a time per
    process: stages that export run one after another (a lane's worker runs one job at a time)."""
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.setFormatter(logging.Formatter("%(levelname)s %(name)s: %(message)s"))
    root = logging.getLogger()
    own = {name: logging.getLogger(name) for name in _SELF_HANDLED_LOGGERS}
    own |= {  # torch's artifact loggers (graph code, symbolic shapes) carry stderr handlers of their own
        name: logger
        for name, logger in list(logging.Logger.manager.loggerDict.items())
        if isinstance(logger, logging.Logger) and name.split(".")[0] == "torch" and logger.handlers
    }
    saved = {name: list(logger.handlers) for name, logger in own.items()}
    root.addHandler(handler)
    for logger in own.values():
        logger.handlers = [handler]
    with (
        warnings.catch_warnings(record=True) as caught,
        contextlib.redirect_stdout(stream),
        contextlib.redirect_stderr(stream),  # torch.export prints the graph it failed on to sys.stderr
        _torchscript_onnx_log_through_python(),
    ):
        warnings.simplefilter("always")
        try:
            yield
        finally:
            root.removeHandler(handler)
            for name, logger in own.items():
                logger.handlers = saved[name]
            log_path.write_text(
                stream.getvalue() + "".join(f"{w.category.__name__}: {w.message}\n" for w in caught)
            )


_SELF_HANDLED_LOGGERS = ("torch", "torch.onnx")


@contextlib.contextmanager
def _torchscript_onnx_log_through_python() -> Iterator[None]:
    """torch's TorchScript-based exporter switches its C++ ONNX log on for every export and leaves it on (its
    setup_onnx_logging tests the is-enabled function instead of calling it), and when an operator cannot be
    exported it logs the whole TorchScript graph, hundreds of lines, to C++'s std::cout, past Python's
    sys.stdout: onto the user's console. That log can only be pointed at stdout or stderr
    (_jit_set_onnx_log_output_stream), so its Python-side call is replaced for the duration with one that
    prints through sys.stdout, which captured() has sent to the stage's log; it prints whether or not the log
    is on, so the graph stays in the log once torch fixes its bug. What torch's C++ code logs by itself while
    the log is on still goes to std::cout. The log's state at entry is restored afterwards."""
    torch = sys.modules.get("torch")
    log = getattr(getattr(torch, "_C", None), "_jit_onnx_log", None)
    if log is None:  # no exporter of torch's has run or can run without torch imported
        yield
        return
    enabled = torch._C._jit_is_onnx_log_enabled()
    torch._C._jit_onnx_log = lambda *parts: print(*parts, sep="", file=sys.stdout)
    try:
        yield
    finally:
        torch._C._jit_onnx_log = log
        torch._C._jit_set_onnx_log_enabled(enabled)
