"""`python -m pipeline ...` as the tests start it: a process of its own, with its argv, working directory,
environment and pipes, forked from a server that has already imported torch and the pipeline
(tests/warm_cli_server.py), instead of an interpreter that imports them again.

A fresh interpreter spends about 4 s of CPU on imports before a command starts; the suite runs some two
hundred commands on two cores, so those imports were a third of `make test`. What the fork does not give
is a start-up: so a command whose environment changes what a process reads once at start-up (HOME, the
thread and library settings, PYTHON*) gets a fresh interpreter, and so does every command with
TESTS_FRESH_CLI=1 (TESTS_WARM_CLI_LOG=FILE lists the commands that got one, and the variables why). Tests
about the start-up itself (a user's own pipeline.py, Ctrl-C on a process group,
the first deploy) start `python -m pipeline` themselves.
"""

from __future__ import annotations

import atexit
import contextlib
import io
import json
import locale
import os
import selectors
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import warnings
from collections.abc import Mapping, Sequence
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
FRESH = os.environ.get("TESTS_FRESH_CLI") == "1"
# what the server's imports read (torch and its OpenMP, matplotlib, transformers, Python itself); not ONNX
# Runtime's or Ray's, which the server does not import (Ray sets RAY_CLIENT_MODE as a test module imports it)
READ_AT_START = (
    "HOME", "MPLCONFIGDIR", "XDG_", "TORCH", "OMP_", "MKL_", "KMP_", "GOMP_", "CUDA", "NVIDIA", "LD_",
    "HF_", "TRANSFORMERS", "LANG", "LC_", "PYTHON",
)  # fmt: skip
# read when used, not at start-up: the child builds sys.path from the command's PYTHONPATH and forgets the
# server's temporary folder; Inductor looks its cache folder up at each compile. The rest are what the
# pipeline sets in its own process when a test runs it in-process (a model from transformers, MLflow,
# TensorRT-RTX, a Triton server), so that the worker's later commands inherit them: a user's new
# interpreter starts without them, as the server did.
READ_WHEN_USED = {
    "PYTHONPATH", "TMPDIR", "TORCHINDUCTOR_CACHE_DIR",
    "HF_HUB_OFFLINE", "MLFLOW_ALLOW_FILE_STORE", "POLYGRAPHY_USE_TENSORRT_RTX", "LD_LIBRARY_PATH",
}  # fmt: skip
# the environment the collection began with: a server started later, inside a test that changed a variable
# (monkeypatch), still imports as the suite's commands expect
SUITE_ENV = dict(os.environ)


def run_pipeline(
    args: Sequence[str],
    *,
    cwd: Path = ROOT,
    env: Mapping[str, str] | None = None,
    timeout: float | None = None,
    fresh: bool = False,
) -> subprocess.CompletedProcess[str]:
    """subprocess.run([python, -m, pipeline, *args], capture_output=True, text=True), warm where it can be
    (fresh: a new interpreter in any case)."""
    command = [sys.executable, "-m", "pipeline", *args]
    environ = dict(os.environ if env is None else env)
    server = None if FRESH or fresh else _server()
    if server is None or not server.serves(environ):
        return subprocess.run(command, cwd=cwd, env=environ, capture_output=True, text=True, timeout=timeout)
    return server.run(command, Path(cwd), environ, timeout)


class _Server:
    def __init__(self) -> None:
        self.folder = Path(tempfile.mkdtemp(prefix="warm-cli-"))
        self.path = self.folder / "socket"
        self.env = {**SUITE_ENV, "PYTHONPATH": str(ROOT)}
        self.log = self.folder / "server.log"
        with self.log.open("wb") as log:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "tests.warm_cli_server", str(self.path)],
                cwd=ROOT,
                env=self.env,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        atexit.register(self.stop)

    def ready(self, timeout: float = 180) -> bool:
        deadline = time.monotonic() + timeout
        while not self.path.exists():
            if self.proc.poll() is not None or time.monotonic() > deadline:
                warnings.warn(f"warm CLI server did not start: {self.log.read_text()[-2000:]}", stacklevel=3)
                return False
            time.sleep(0.05)
        return True

    def serves(self, environ: Mapping[str, str]) -> bool:
        changed = {
            k for k in set(environ) | set(self.env) if environ.get(k) != self.env.get(k)
        } - READ_WHEN_USED
        at_start = sorted(k for k in changed if k.startswith(READ_AT_START))
        if at_start and os.environ.get("TESTS_WARM_CLI_LOG"):  # why a command got a new interpreter
            with open(os.environ["TESTS_WARM_CLI_LOG"], "a") as log:
                log.write(f"{os.environ.get('PYTEST_CURRENT_TEST', '-')}: {' '.join(at_start)}\n")
        return not at_start

    def run(
        self, command: list[str], cwd: Path, environ: dict[str, str], timeout: float | None
    ) -> subprocess.CompletedProcess[str]:
        out_r, out_w = os.pipe()
        err_r, err_w = os.pipe()
        stdin = os.open(os.devnull, os.O_RDONLY)
        conn = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        try:
            conn.connect(str(self.path))
            request = {"argv": command[3:], "cwd": str(cwd), "env": environ}
            socket.send_fds(conn, [json.dumps(request).encode()], [stdin, out_w, err_w])
        finally:
            for fd in (stdin, out_w, err_w):
                os.close(fd)
        try:
            pid = json.loads(conn.recv(1 << 16))["pid"]
            deadline = None if timeout is None else time.monotonic() + timeout
            out, err, finished = _drain(out_r, err_r, deadline)
            if not finished:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            answer = conn.recv(1 << 16)
            if not answer:
                raise RuntimeError(f"warm CLI server died: {self.log.read_text()[-2000:]}")
        finally:
            conn.close()
        if not finished:
            raise subprocess.TimeoutExpired(command, timeout or 0, output=_text(out), stderr=_text(err))
        code = os.waitstatus_to_exitcode(json.loads(answer)["status"])
        return subprocess.CompletedProcess(command, code, _text(out), _text(err))

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(10)
        shutil.rmtree(self.folder, ignore_errors=True)


def _drain(out_r: int, err_r: int, deadline: float | None) -> tuple[bytes, bytes, bool]:
    """Both pipes read to their end (every holder closed them), or until the deadline."""
    chunks: dict[int, list[bytes]] = {out_r: [], err_r: []}
    with selectors.DefaultSelector() as selector:
        for fd in chunks:
            selector.register(fd, selectors.EVENT_READ)
        while selector.get_map():
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                break
            for key, _ in selector.select(left):
                data = os.read(key.fd, 1 << 16)
                if data:
                    chunks[key.fd].append(data)
                else:
                    selector.unregister(key.fd)
        finished = not selector.get_map()
    for fd in chunks:
        os.close(fd)
    return b"".join(chunks[out_r]), b"".join(chunks[err_r]), finished


def _text(data: bytes) -> str:
    """As subprocess decodes with text=True: the locale's encoding, universal newlines."""
    return io.TextIOWrapper(io.BytesIO(data), encoding=locale.getpreferredencoding(False)).read()


_lock = threading.Lock()
_started: dict[int, _Server | None] = {}


def _server() -> _Server | None:
    """This process's server, started on first use (a forked pytest worker gets its own)."""
    with _lock:
        pid = os.getpid()
        if pid not in _started:
            server = _Server()
            _started[pid] = server if server.ready() else None
        return _started[pid]
