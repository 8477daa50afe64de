"""Unit tests run pre-flight's model check in the test's own process (pipeline/preflight/model_child.py IN_PROCESS): the
same checks and messages without a child's start-up of torch per call. The child's isolation of a crashing
or hanging model is tested through the real command (tests/reliability/test_user_code.py)."""

from __future__ import annotations

import pytest

from pipeline.preflight.model_child import IN_PROCESS


@pytest.fixture(autouse=True)
def model_check_in_process(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(IN_PROCESS, "1")
