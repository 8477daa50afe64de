"""torch.compile'd modules kept for the rest of a deploy: one compile per (program, device, mode) per process.

Validation activates a runner for every torch.compile runtime, and the benchmark activates one again at each
benchmarked shape. A fresh module at each activation means dynamo traces it again and Inductor loads its
kernels again: 16 s of the benchmark's 112 s in an H200 deploy, for work validation had already done. So the
first activation compiles and the later ones take the same compiled callable (its CUDA graphs per shape
included). The module's weights stay on the device in between: their bytes (its parameters and buffers)
are counted when it is loaded, so that a later activation's peak-memory reading can add what that activation
did not allocate itself (`resident_bytes`). The benchmark releases them all when it ends (`release_all`).
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Hashable
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Compiled:
    fn: Callable[..., Any]
    resident_bytes: int  # device memory the loaded module holds (weights and buffers); 0 on the CPU


_kept: dict[tuple[Hashable, str], Compiled] = {}


def compiled(load: Callable[[], Any], mode: str, device: str) -> tuple[Compiled, bool]:
    """The compiled module of `load()` (a hashable loader) in this mode, and whether it was kept from an
    earlier activation. Dynamic shapes: one graph serves every batch above 1 and every length, as a server
    needs (torch.compile specializes size 1)."""
    key = (load, mode)
    if key in _kept:
        return _kept[key], True
    import torch

    module = load()
    resident = device_bytes(module) if device != "cpu" else 0
    fn = torch.compile(module, mode=None if mode == "default" else mode, dynamic=True)
    _kept[key] = Compiled(fn, resident)
    return _kept[key], False


def device_bytes(module: Any) -> int:
    """Bytes of the module's parameters and buffers that live on a GPU (each tensor counted once)."""
    tensors = {id(t): t for t in itertools.chain(module.parameters(), module.buffers()) if t.is_cuda}
    return sum(t.numel() * t.element_size() for t in tensors.values())


def release_all() -> None:
    """Drop every kept module (its weights and CUDA graphs go with the last reference)."""
    _kept.clear()
