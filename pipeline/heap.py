"""Garbage collection that skips what was there before: for stages that collect after every runner.

Validation collects after each runner and the benchmark after each shape, so that a released runner's device
memory is really free before the next one loads. A full collection walks every object the process holds: after
the imports and the reference model that is some 300 000, 0.3 s per collection on a 2-core machine, a dozen
times per deploy. Inside `frozen_heap()` the objects that existed on entry are left out of collections (they
stay alive anyway); on exit they are collectable again. `release()` collects and then leaves the survivors out
of the next collections too: a torch.compile inside validation adds millions of objects that stay alive (the
compiled module is kept for the benchmark), and every collection after it walked them again (0.15 s each on
the H200 host, 24 per deploy)."""

from __future__ import annotations

import contextlib
import gc
from collections.abc import Iterator


@contextlib.contextmanager
def frozen_heap() -> Iterator[None]:
    gc.collect()
    gc.freeze()
    try:
        yield
    finally:
        gc.unfreeze()


def release() -> None:
    """Collect what the last runner left, then freeze what survived (undone when frozen_heap exits; outside it,
    a plain collection)."""
    gc.collect()
    if gc.get_freeze_count():
        gc.freeze()
