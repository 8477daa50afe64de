from __future__ import annotations

import pytest

from tests.unit.report import samples


@pytest.fixture
def inputs() -> dict:
    """The arguments of the renderers, fresh per test (tests may mutate them)."""
    return {
        "header": samples.header(),
        "accuracy": samples.accuracy(),
        "speed": samples.speed(),
        "winner": samples.winner(),
        "stages": samples.stages(),
    }
