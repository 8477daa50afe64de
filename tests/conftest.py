"""Suite-wide collection order, and a terminal's Ctrl-C for the processes the tests start."""

from __future__ import annotations

import signal

import pytest

# A suite started in the background (`make test &`, nohup) inherits SIGINT ignored, and every process a test
# starts would too: the tests that press Ctrl-C on a deploy or a fleet would then test nothing. Python's own
# handler here makes the children start with SIGINT's default, as under a terminal or CI.
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The zoo first: `make test` hands out whole files to two workers (--dist loadfile), and the zoo's one file
    deploys eleven models (about six minutes); started first, it runs beside the other files instead of after
    them."""
    items.sort(key=lambda item: not item.nodeid.startswith("tests/zoo/"))
