"""frozen_heap: collections inside leave out what existed on entry, and it is collectable again after."""

from __future__ import annotations

import gc
import weakref

from pipeline.core.heap import frozen_heap


class _Node:
    def __init__(self) -> None:
        self.me = self  # a cycle: only the collector frees it


def test_garbage_from_before_waits_for_the_exit_and_new_garbage_does_not() -> None:
    old = _Node()
    old_ref = weakref.ref(old)
    with frozen_heap():
        del old
        new = _Node()
        new_ref = weakref.ref(new)
        del new
        gc.collect()
        assert new_ref() is None  # made inside: collected
        assert old_ref() is not None  # frozen: left out
    gc.collect()
    assert old_ref() is None and gc.get_freeze_count() == 0
