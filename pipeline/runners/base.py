"""One inference interface for every artifact kind; validation and benchmark share it. Runners never time."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import numpy as np

Feeds = dict[str, np.ndarray]


class Runner(Protocol):
    """Loads one artifact for inference.

    infer() takes host numpy feeds and returns host numpy outputs by name (host I/O). A runner with
    io == "device" keeps inputs and outputs on the GPU: prepare(feeds) stages them once per shape, and
    infer_prepared() runs without copies; infer() still returns host arrays for validation.
    """

    artifact: str
    runtime: (
        str  # torch-cpu | torchscript-cpu | onnxruntime-cpu | onnxruntime-cuda | tensorrt | tensorrt-rtx ...
    )
    io: str  # host | device

    def activate(self) -> None: ...

    def infer(self, feeds: Feeds) -> Feeds: ...

    def prepare(self, feeds: Feeds) -> None: ...

    def infer_prepared(self) -> None: ...

    def synchronize(self) -> None: ...

    def deactivate(self) -> None: ...


@dataclass(frozen=True)
class NotRunnable:
    """Why an artifact cannot run on this machine (goes to the reports' not_run lists)."""

    artifact: str
    reason: str
