"""The server behind tests/warm_cli.py: one process per pytest worker that has imported what a command of the
CLI imports (torch, ONNX, matplotlib, transformers; about 4 s of CPU; not ONNX Runtime, whose import
starts a thread), and forks a child per
command. The child takes the caller's argv, working directory, environment and standard streams, then runs
`python -m pipeline` as a fresh interpreter would (runpy, the same __main__).

Fork safety: this process only imports. It runs no torch operator (no OpenMP pool, whose locks a fork would
copy) and no thread besides its own; it refuses to serve (exits) if an import started one.

Protocol, over a SOCK_SEQPACKET Unix socket, one connection per command: the client sends
{"argv", "cwd", "env"} with three file descriptors (stdin, stdout, stderr); the server answers {"pid"} once
forked and {"status"} (a wait status) when the child is reaped. A client that hangs up first has its child
killed.
"""

from __future__ import annotations

import contextlib
import json
import os
import selectors
import signal
import socket
import sys
from pathlib import Path

PRELOAD = (
    "pipeline.cli",
    "pipeline.run.deploy",
    "pipeline.report.plots",
    "matplotlib.figure",
    "matplotlib.backends.backend_agg",
    "polygraphy.comparator",
    "transformers",
    "transformers.modeling_utils",
    "transformers.masking_utils",
    "transformers.modeling_layers",
    "torch.export._trace",
    "torch._functorch.aot_autograd",
    "torch.onnx._internal.exporter._compat",
    "onnxscript.function_libs.torch_lib.ops",
    "onnxscript.optimizer",
)


def _preload() -> None:
    import importlib

    for name in PRELOAD:
        try:
            importlib.import_module(name)
        except ImportError:
            continue  # an extra not installed: its commands import it themselves


def _threads() -> int:
    return len(os.listdir("/proc/self/task"))


def _child(request: dict, fds: list[int], base_path: list[str]) -> None:
    """In the forked child: become the command, run it, and never return into the server's loop."""
    code = 1
    try:
        for target, fd in enumerate(fds):
            os.dup2(fd, target)
            os.close(fd)
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        signal.signal(signal.SIGINT, signal.default_int_handler)
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        os.chdir(request["cwd"])
        os.environ.clear()
        os.environ.update(request["env"])
        extra = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
        sys.path[:] = [request["cwd"], *extra, *base_path]
        import importlib
        import random
        import tempfile

        importlib.invalidate_caches()
        for name in [m for m in sys.modules if m == "tests" or m.startswith("tests.")]:
            del sys.modules[name]  # this server's own package: a new interpreter finds it on sys.path, or not
        tempfile.tempdir = None  # chosen again from this command's TMPDIR
        random.seed()  # a fresh interpreter seeds from the OS; a fork would share the server's state
        _fork_allowed_in_preflight()
        import runpy

        sys.argv = ["-m", *request["argv"]]
        runpy.run_module("pipeline", run_name="__main__", alter_sys=True)
        code = 0
    except SystemExit as stop:
        code = stop.code if isinstance(stop.code, int) else (0 if stop.code is None else 1)
        if not isinstance(stop.code, int | None):
            print(stop.code, file=sys.stderr)
    except KeyboardInterrupt:
        code = 130
    except BaseException:
        import traceback

        traceback.print_exc()
    finally:
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(Exception):
                stream.flush()
        os._exit(code)


def _fork_allowed_in_preflight() -> None:
    """The CLI lets pre-flight fork only where torch was not imported when it started (no torch operator can
    have run). Here torch was imported but, as above, never ran: the condition that rule stands for holds."""
    from pipeline.preflight import model_child

    def allow_fork() -> None:
        model_child._Process.fork_allowed = True

    model_child.allow_fork = allow_fork


def serve(path: str) -> None:
    _preload()
    threads = _threads()
    if threads != 1:
        sys.exit(f"warm CLI server: {threads} threads after the imports; a fork would not be safe")
    base_path = [p for p in sys.path[1:] if p not in os.environ.get("PYTHONPATH", "").split(os.pathsep)]
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    listener.bind(path + ".tmp")
    listener.listen(16)
    os.rename(path + ".tmp", path)  # the client waits for this name: bound and listening, imports done
    parent = os.getppid()
    selector = selectors.DefaultSelector()
    selector.register(listener, selectors.EVENT_READ)
    children: dict[int, socket.socket] = {}
    while os.getppid() == parent:
        for key, _ in selector.select(timeout=0.02):
            if key.fileobj is listener:
                conn, _ = listener.accept()
                message, fds, _, _ = socket.recv_fds(conn, 1 << 20, 3)
                sys.stdout.flush()
                sys.stderr.flush()
                pid = os.fork()
                if pid == 0:
                    for held in (listener, conn, *children.values()):
                        held.close()
                    selector.close()
                    _child(json.loads(message), fds, base_path)
                for fd in fds:
                    os.close(fd)
                conn.send(json.dumps({"pid": pid}).encode())
                children[pid] = conn
                selector.register(conn, selectors.EVENT_READ, pid)
            else:  # a client hung up (or sent something): its command goes too
                pid = key.data
                key.fileobj.recv(16)
                os.kill(pid, signal.SIGKILL)
                selector.unregister(key.fileobj)
        _reap(children, selector)
    for pid in children:
        os.kill(pid, signal.SIGKILL)


def _reap(children: dict[int, socket.socket], selector: selectors.BaseSelector) -> None:
    while children:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        conn = children.pop(pid, None)
        if conn is None:
            continue
        with contextlib.suppress(KeyError):
            selector.unregister(conn)
        with contextlib.suppress(OSError):
            conn.send(json.dumps({"status": status}).encode())
        conn.close()


if __name__ == "__main__":
    serve(sys.argv[1])
    Path(sys.argv[1]).unlink(missing_ok=True)
