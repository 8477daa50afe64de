"""A KeyboardInterrupt is told from a Ctrl-C by the signal: under a terminal's Ctrl-C handler by whether SIGINT
arrived, and in a process started with SIGINT ignored (in the background, under nohup), where no Ctrl-C can
arrive, every KeyboardInterrupt is code's."""

from __future__ import annotations

import os
import signal
import time

import pytest

from pipeline.core.user_code import UserCodeExit, as_user_exit, interrupts_watched


@pytest.fixture
def restored_sigint():
    before = signal.getsignal(signal.SIGINT)
    yield
    signal.signal(signal.SIGINT, before)


def test_with_sigint_ignored_every_keyboard_interrupt_is_the_codes(restored_sigint) -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    with interrupts_watched():
        assert isinstance(as_user_exit(KeyboardInterrupt()), UserCodeExit)
    assert signal.getsignal(signal.SIGINT) is signal.SIG_IGN  # left as it was
    assert as_user_exit(KeyboardInterrupt()) is None  # outside the watch: taken as a Ctrl-C, as before


def test_under_the_default_handler_a_real_sigint_is_a_ctrl_c(restored_sigint) -> None:
    signal.signal(signal.SIGINT, signal.default_int_handler)
    with interrupts_watched():
        assert isinstance(as_user_exit(KeyboardInterrupt()), UserCodeExit)  # no SIGINT arrived
        with pytest.raises(KeyboardInterrupt) as raised:
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(1)  # the handler runs here
        assert as_user_exit(raised.value) is None  # the signal arrived: a Ctrl-C
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
