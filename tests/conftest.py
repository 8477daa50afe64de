"""Suite-wide collection order."""

from __future__ import annotations

import pytest


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The zoo first: `make test` hands out whole files to two workers (--dist loadfile), and the zoo's one file
    deploys eleven models (about six minutes); started first, it runs beside the other files instead of after
    them."""
    items.sort(key=lambda item: not item.nodeid.startswith("tests/zoo/"))
