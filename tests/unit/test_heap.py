"""frozen_heap: collections inside leave out what existed on entry, and it is collectable again after."""

from __future__ import annotations

import gc
import weakref

from pipeline.heap import frozen_heap, release


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


def test_release_frees_the_last_runners_garbage_and_leaves_survivors_out_of_later_collections() -> None:
    with frozen_heap():
        kept = _Node()  # alive after the release: frozen with the heap from then on
        dropped = _Node()
        dropped_ref = weakref.ref(dropped)
        del dropped
        before = gc.get_freeze_count()
        release()
        assert dropped_ref() is None  # the released runner's cycle is gone
        assert gc.get_freeze_count() > before  # the survivors (kept among them) are no longer walked
        kept_ref = weakref.ref(kept)
        del kept
        release()
        assert kept_ref() is not None  # frozen: it waits for the exit, like what existed on entry
    gc.collect()
    assert kept_ref() is None and gc.get_freeze_count() == 0


def test_release_outside_a_frozen_heap_is_a_plain_collection() -> None:
    dropped = _Node()
    dropped_ref = weakref.ref(dropped)
    del dropped
    release()
    assert dropped_ref() is None and gc.get_freeze_count() == 0
