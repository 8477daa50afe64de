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


def test_per_token_outputs_are_compared_on_real_tokens_and_the_reference_is_left_as_it_was() -> None:
    """A padding-aware or packed run leaves padded positions undefined; a pooled output as wide as the sequence
    is no per-token output; and the reference's results, shared by every artifact, are never changed."""
    rng = np.random.default_rng(0)
    hidden = rng.standard_normal((2, 4, 3)).astype(np.float32)
    pooled = rng.standard_normal((2, 4)).astype(np.float32)  # as wide as the sequence: not per-token
    mask = np.array([[1, 1, 0, 0], [1, 1, 1, 0]])
    reference = {"torch": [IterationResult({"hidden": hidden, "pooled": pooled}, runner_name="torch")]}
    kept = {k: v.copy() for k, v in reference["torch"][0].items()}
    other = hidden.copy()
    other[mask == 0] = 9.0  # differs on padding only
    actual = {"onnx": [IterationResult({"hidden": other, "pooled": pooled}, runner_name="onnx")]}
    found = polygraphy_verdict(reference, actual, ["hidden", "pooled"], Tolerance(), [mask])
    assert found["hidden"]["passed"] is True and found["pooled"]["passed"] is True, found
    for name, value in reference["torch"][0].items():
        assert np.array_equal(value, kept[name]), name  # the shared reference is untouched
    shifted = {"onnx": [IterationResult({"hidden": other, "pooled": pooled + 1.0}, runner_name="onnx")]}
    assert (
        polygraphy_verdict(reference, shifted, ["hidden", "pooled"], Tolerance(), [mask])["pooled"]["passed"]
        is False
    )


def test_the_cross_check_of_integer_and_boolean_outputs_prints_no_numpy_warning() -> None:
    """The cross-check runs inside the deploy's live display: a detector's labels and keep mask, integers and
    booleans that are 0 where the reference is 0, must not print numpy's 0/0 warning over it."""
    import warnings

    outputs = {
        "labels": np.array([[0, 3, 3, 1]], dtype=np.int64),
        "keep": np.array([[True, False, False, True]]),
    }
    reference = {"torch": [IterationResult(outputs, runner_name="torch")]}
    actual = {"onnx": [IterationResult({k: v.copy() for k, v in outputs.items()}, runner_name="onnx")]}
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        found = polygraphy_verdict(reference, actual, list(outputs), Tolerance())
    assert all(found[name]["passed"] is True for name in outputs), found
    assert [str(w.message) for w in caught if issubclass(w.category, RuntimeWarning)] == []
