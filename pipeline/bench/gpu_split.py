"""Which GPU times which candidates, when a deploy asks for several at once (`benchmark.parallel_gpus`).

Timings must stay isolated: one process per GPU, which sees that GPU alone (CUDA_VISIBLE_DEVICES), so that no
candidate shares a device, a CUDA context or a Python interpreter with a candidate on another GPU. An artifact's
runtimes stay on one GPU: its modes (plain, CUDA graph, compiled) are compared with each other side by side, as
they are on one GPU. Artifacts are dealt out largest first, each to the GPU with the fewest cells so far.
Pure: no CUDA, no processes.
"""

from __future__ import annotations

import os
from collections.abc import Sequence

Key = tuple[str, str, str]  # (artifact, runtime, io)


def visible_gpus(count: int) -> list[str]:
    """The ids to pin each worker with: this process's own CUDA_VISIBLE_DEVICES entries where it has them (a
    worker must see a GPU this process was given), else 0..count-1."""
    given = [d.strip() for d in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if d.strip()]
    return given[:count] if given else [str(i) for i in range(count)]


def split(keys: Sequence[Key], gpus: int) -> list[list[Key]]:
    """The keys in `gpus` groups (fewer when there are fewer artifacts), each artifact's keys in one group,
    in the given order within a group."""
    by_artifact: dict[str, list[Key]] = {}
    for key in keys:
        by_artifact.setdefault(key[0], []).append(key)
    groups: list[list[Key]] = [[] for _ in range(min(gpus, len(by_artifact)))]
    for cells in sorted(by_artifact.values(), key=len, reverse=True):
        min(groups, key=len).extend(cells)
    order = {key: i for i, key in enumerate(keys)}
    return [sorted(group, key=order.__getitem__) for group in groups if group]


def plan_note(asked: int, gpus: int, groups: int) -> str | None:
    """Why fewer GPUs time the candidates than the recipe asked for, or None."""
    if asked <= 1 or groups >= asked:
        return None
    if gpus < 2:
        return f"benchmark.parallel_gpus is {asked}, but this host has {gpus} GPU(s): timed on one"
    if groups < min(asked, gpus):
        return f"benchmark.parallel_gpus is {asked}: {groups} GPU(s) used, one per GPU artifact to time"
    return f"benchmark.parallel_gpus is {asked}, but this host has {gpus} GPUs: timed on {groups}"
