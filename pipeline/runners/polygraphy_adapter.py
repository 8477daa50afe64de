"""A pipeline Runner seen as a Polygraphy runner, so that Polygraphy's Comparator drives every runtime
(torch, TorchScript, ONNX Runtime, TensorRT) through one loop with the same feeds; and Polygraphy's own
elementwise verdict on two runs, recorded beside the pipeline's checks."""

from __future__ import annotations

import math
import time
from collections import OrderedDict
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import numpy as np
from polygraphy.backend.base import BaseRunner
from polygraphy.common import TensorMetadata

from pipeline.inputs.data import NUMPY_DTYPES

if TYPE_CHECKING:
    from pipeline.inputs.specs import RunnerSettings
    from pipeline.recipe import Tolerance
    from pipeline.runners.base import Runner


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


def polygraphy_verdict(
    reference: Any,
    actual: Any,
    outputs: list[str],
    tolerance: Tolerance,
    masks: list[np.ndarray | None] | None = None,
    unmasked: frozenset[str] = frozenset(),
) -> dict[str, Any]:
    """Polygraphy's own elementwise verdict per output (CompareFunc.simple with the recipe's max_abs as atol and
    max_rel as rtol): recorded beside our checks for cross-reference; it never gates. `masks`, per iteration,
    is the padding mask (validation.padding_mask): per-token outputs (but the `unmasked`,
    accuracy.off_the_mask_axis) are compared on real tokens only, as our checks compare them, since
    padding-aware and packed runs leave padded positions undefined."""
    from polygraphy.comparator import Comparator, CompareFunc, RunResults
    from polygraphy.comparator.struct import IterationResult
    from polygraphy.logger import G_LOGGER

    from pipeline.check.accuracy import per_token_mask, thresholds_for, token_mask

    atol = {o: thresholds_for(tolerance, o)["max_abs"][0] or 1e-5 for o in outputs}
    rtol = {o: thresholds_for(tolerance, o)["max_rel"][0] or 1e-5 for o in outputs}
    ((ref_name, ref_iters),) = reference.items()
    ((act_name, act_iters),) = actual.items()

    def compared(iterations: list[Any]) -> list[Any]:
        """Copies (the reference's results are shared by every artifact's check), masked on per-token outputs
        and contiguous (Polygraphy views every array: a transposed output made it raise)."""
        copies = []
        for i, iteration in enumerate(iterations):
            mask = masks[i] if masks is not None and i < len(masks) else None
            outputs = {}
            for name, value in iteration.items():
                if isinstance(value, np.ndarray):
                    keep = per_token_mask(value, token_mask(name, mask, unmasked))
                    value = np.ascontiguousarray(value if keep is None else np.where(keep, value, 0))
                outputs[name] = value
            copies.append(IterationResult(outputs, iteration.runtime, iteration.runner_name))
        return copies

    ref_iters, act_iters = compared(ref_iters), compared(act_iters)
    combined = RunResults([(ref_name, ref_iters), (act_name, act_iters)])
    # integer and boolean outputs (labels, keep masks) that are 0 where the reference is 0 give Polygraphy's
    # relative difference 0/0 (it offsets float zeros only): numpy warns on the user's console, and the NaN
    # is recorded as None below
    with G_LOGGER.verbosity(G_LOGGER.CRITICAL), np.errstate(divide="ignore", invalid="ignore"):
        results = Comparator.compare_accuracy(combined, compare_func=CompareFunc.simple(atol=atol, rtol=rtol))
    per_output: dict[str, Any] = {}
    for iteration in next(iter(results[0].values())):
        for output, result in iteration.items():
            entry = per_output.setdefault(
                output, {"passed": True, "atol": atol[output], "rtol": rtol[output]}
            )
            entry["passed"] = entry["passed"] and bool(result)
            for stat in ("max_absdiff", "max_reldiff"):
                value = _finite_or_none(getattr(result, stat, None))
                if value is None or entry.get(stat, -1.0) is None:
                    entry[stat] = None
                else:
                    entry[stat] = max(entry.get(stat, value), value)
    return per_output


def _finite_or_none(value: Any) -> float | None:
    try:
        value = float(value)
    except (TypeError, ValueError):
        return None
    return value if math.isfinite(value) else None
