"""How `python -m pipeline` leaves (pipeline/core/quick_exit.py): in a real child interpreter, as a command
ends, with what Python's own exit would have kept."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _leave(body: str, tmp_path: Path, **kwargs: object) -> subprocess.CompletedProcess[str]:
    script = tmp_path / "command.py"
    script.write_text(
        "import atexit, ctypes, sys, threading, time\n"
        "from pipeline.core.quick_exit import quick_exit\n" + body
    )
    return subprocess.run(
        [sys.executable, str(script)],
        cwd=ROOT,
        env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"},  # no PYTHONUNBUFFERED: stdout is buffered
        text=True,
        timeout=60,
        **({"stdout": subprocess.PIPE, "stderr": subprocess.PIPE} | kwargs),
    )


def test_the_exit_code_atexit_handlers_and_buffered_output_all_survive(tmp_path: Path) -> None:
    mark = tmp_path / "atexit-ran"
    result = _leave(
        f"atexit.register(lambda: open({str(mark)!r}, 'w').write('yes'))\n"
        "print('from python')\n"
        "ctypes.CDLL(None).printf(b'from C\\n')\n"
        "quick_exit(2)\n",
        tmp_path,
    )
    assert result.returncode == 2, result.stderr
    assert mark.read_text() == "yes"
    assert sorted(result.stdout.splitlines()) == ["from C", "from python"]


def test_output_that_cannot_be_written_is_a_failure_as_python_makes_it(tmp_path: Path) -> None:
    with open("/dev/full", "w") as full:
        result = _leave("print('x' * 100)\nquick_exit(0)\n", tmp_path, stdout=full, stderr=subprocess.PIPE)
    assert result.returncode == 120, result.stderr
    assert "No space left on device" in result.stderr


def test_no_stdout_at_all_is_not_a_crash(tmp_path: Path) -> None:
    result = _leave("sys.stdout = None\nquick_exit(0)\n", tmp_path)
    assert result.returncode == 0, result.stderr


def test_a_thread_still_working_is_waited_for(tmp_path: Path) -> None:
    mark = tmp_path / "thread-done"
    result = _leave(
        f"def work():\n    time.sleep(0.3)\n    open({str(mark)!r}, 'w').write('done')\n"
        "threading.Thread(target=work).start()\n"
        "quick_exit(0)\n",
        tmp_path,
    )
    assert result.returncode == 0, result.stderr
    assert mark.read_text() == "done"


def test_under_a_profiler_the_ordinary_exit_lets_it_write(tmp_path: Path) -> None:
    mark = tmp_path / "after"
    result = _leave(
        f"sys.setprofile(lambda *a: None)\ntry:\n    quick_exit(0)\nfinally:\n"
        f"    open({str(mark)!r}, 'w').write('reached')\n",
        tmp_path,
    )
    assert result.returncode == 0, result.stderr
    assert mark.read_text() == "reached"  # sys.exit unwinds through the caller, as under cProfile
