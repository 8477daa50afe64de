"""Suite-wide collection order, a terminal's Ctrl-C and one torch thread for the processes the tests start."""

from __future__ import annotations

import os
import signal

import pytest

# A suite started in the background (`make test &`, nohup) inherits SIGINT ignored, and every process a test
# starts would too: the tests that press Ctrl-C on a deploy or a fleet would then test nothing. Python's own
# handler here makes the children start with SIGINT's default, as under a terminal or CI.
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)

# `make test` runs two workers on a 2-core machine, each deploying in child processes: torch's default pool of a
# thread per core in every one of them (tracing, exports, pre-flight) made them take turns, spinning, and a
# forward of the tiny recipe's model took 21 ms against 1.2 on one thread. The runners take it too, as their
# default where a recipe names no `benchmark.intra_op_threads` (pipeline/inputs/specs.py).
os.environ.setdefault("OMP_NUM_THREADS", "1")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The zoo first: `make test` hands out whole files to two workers (--dist loadfile), and the zoo's one file
    deploys eleven models (about six minutes); started first, it runs beside the other files instead of after
    them."""
    items.sort(key=lambda item: not item.nodeid.startswith("tests/zoo/"))
