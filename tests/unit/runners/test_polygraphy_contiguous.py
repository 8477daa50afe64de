"""Polygraphy's cross-check on outputs that are views (a transposed box tensor, a similarity matrix): it raised
"Input array to view() must be contiguous" on every artifact of such a model, and the cross-check was lost."""

from __future__ import annotations

import numpy as np
from polygraphy.comparator import IterationResult

from pipeline.recipe.measure import Tolerance
from pipeline.runners.polygraphy_adapter import polygraphy_verdict


def test_the_cross_check_compares_outputs_that_are_not_contiguous() -> None:
    values = np.arange(24, dtype=np.float32).reshape(4, 6)
    reference = {"torch": [IterationResult({"boxes": values.T}, runner_name="torch")]}
    actual = {"onnx": [IterationResult({"boxes": (values + 1e-7).T}, runner_name="onnx")]}
    found = polygraphy_verdict(reference, actual, ["boxes"], Tolerance())
    assert found["boxes"]["passed"] is True, found
    far = {"onnx": [IterationResult({"boxes": (values + 5.0).T}, runner_name="onnx")]}
    assert polygraphy_verdict(reference, far, ["boxes"], Tolerance())["boxes"]["passed"] is False
