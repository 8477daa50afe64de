"""A pipeline Runner seen as a Polygraphy runner, so that Polygraphy's Comparator drives every runtime
(torch, TorchScript, ONNX Runtime, TensorRT) through one loop with the same feeds."""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable
from typing import TYPE_CHECKING

import numpy as np
from polygraphy.backend.base import BaseRunner
from polygraphy.common import TensorMetadata

from pipeline.data import NUMPY_DTYPES

if TYPE_CHECKING:
    from pipeline.runners.base import Runner
    from pipeline.specs import RunnerSettings


def runner_name(runner: Runner) -> str:
    """Unique per artifact, runtime and I/O mode: Polygraphy keys its run results by runner name."""
    return f"{runner.artifact}:{runner.runtime}:{runner.io}"


class PolygraphyRunner(BaseRunner):
    """Wraps one pipeline Runner; inputs and outputs are named and ordered by the recipe.

    Activation and release stay with the wrapped runner: Comparator.run enters and leaves this object as a
    context manager, which calls activate()/deactivate() on it exactly once per run. `on_infer(i)` is called
    before the i-th inference of an activation (progress text; Comparator's loop has no hook of its own).
    """

    def __init__(
        self, runner: Runner, settings: RunnerSettings, on_infer: Callable[[int], None] | None = None
    ):
        super().__init__(name=runner_name(runner))
        self.runner = runner
        self.settings = settings
        self.on_infer = on_infer
        self.calls = 0

    def activate_impl(self) -> None:
        self.calls = 0
        self.runner.activate()

    def get_input_metadata_impl(self) -> TensorMetadata:
        """Recipe inputs; dynamic dims keep their names, which Polygraphy treats as dynamic."""
        meta = TensorMetadata()
        for spec in self.settings.inputs:
            meta.add(spec.name, np.dtype(NUMPY_DTYPES[spec.dtype]), list(spec.shape))
        return meta

    def infer_impl(self, feed_dict: dict[str, np.ndarray]) -> OrderedDict[str, np.ndarray]:
        """Host numpy outputs named and ordered by the recipe's outputs.

        inference_time is set only because Polygraphy's bookkeeping reads it; it is never reported (the
        benchmark stage owns timing).
        """
        if self.on_infer is not None:
            self.on_infer(self.calls)
        self.calls += 1
        start = time.perf_counter()
        results = self.runner.infer(dict(feed_dict))
        self.inference_time = time.perf_counter() - start
        missing = [name for name in self.settings.outputs if name not in results]
        if missing:
            raise KeyError(
                f"{self.runner.artifact} on {self.runner.runtime} returned outputs {sorted(results)}, "
                f"not {missing} that the recipe names"
            )
        return OrderedDict((name, np.asarray(results[name])) for name in self.settings.outputs)

    def deactivate_impl(self) -> None:
        self.runner.deactivate()
