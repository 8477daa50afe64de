"""Metrics with hand-computed values, tolerance resolution, NaN handling, and ArtifactAccuracy truthiness."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from pipeline.check.accuracy import (
    COMPARABLE,
    FINITE,
    ArtifactAccuracy,
    Check,
    checks_for,
    combine,
    cosine,
    evaluate,
    max_abs,
    max_rel,
    mean_abs,
    measure,
    neighbour_agreement,
    thresholds_for,
)
from pipeline.check.results import artifact_entry
from pipeline.check.verdicts import AccuracyRecord
from pipeline.recipe import Tolerance

REF = np.array([[1.0, 2.0], [3.0, -4.0]], dtype=np.float32)
OUT = np.array([[1.5, 2.0], [3.0, -3.0]], dtype=np.float32)


def test_max_and_mean_abs_hand_computed() -> None:
    assert max_abs(REF, OUT) == pytest.approx(1.0)
    assert mean_abs(REF, OUT) == pytest.approx((0.5 + 0 + 0 + 1.0) / 4)


def test_max_rel_hand_computed_and_epsilon_guards_zero() -> None:
    assert max_rel(REF, OUT) == pytest.approx(max(0.5 / 1.0, 1.0 / 4.0))
    zero_ref = np.zeros(3)
    assert max_rel(zero_ref, np.array([0.0, 1e-6, 0.0]), epsilon=1e-3) == pytest.approx(1e-3)
    assert math.isfinite(max_rel(zero_ref, np.ones(3)))


def test_cosine_is_lowest_row() -> None:
    ref = np.array([[1.0, 0.0], [1.0, 1.0]])
    out = np.array([[1.0, 0.0], [1.0, 0.0]])  # row 1: cos 45 degrees
    assert cosine(ref, out) == pytest.approx(1 / math.sqrt(2))
    assert cosine(ref, ref * 3.0) == pytest.approx(1.0)


def test_cosine_flattens_everything_but_the_batch_axis() -> None:
    ref = np.ones((2, 3, 4))
    out = ref.copy()
    out[1, :, :2] = -1.0  # half the elements of sample 1 flipped: cosine 0
    assert cosine(ref, out) == pytest.approx(0.0)


def test_cosine_zero_rows() -> None:
    assert cosine(np.zeros((1, 3)), np.zeros((1, 3))) == 1.0
    assert cosine(np.zeros((1, 3)), np.ones((1, 3))) == 0.0


def test_measure_flags_shape_mismatch_missing_output_and_broken_reference() -> None:
    assert "shape" in measure(REF, OUT[:1]).problem
    assert "missing" in measure(REF, None).problem
    assert "reference" in measure(np.array([np.nan, 1.0]), np.ones(2)).problem


def test_incomparable_output_is_one_failed_required_check() -> None:
    acc = evaluate(
        ArtifactAccuracy("a", "fp32", "x"),
        {"opt": [{"y": REF}]},
        {"opt": [{"y": OUT[:1]}]},
        ["y"],
        Tolerance(),
    )
    (check,) = acc.checks
    assert check.metric == COMPARABLE and check.blocking
    assert acc.reason.startswith("y not comparable at opt: shape [1, 2] differs from the reference [2, 2]")


def test_combine_aggregates_batches() -> None:
    a = measure(np.ones((1, 4)), np.ones((1, 4)) * 1.1)  # 4 elements, mean_abs 0.1
    b = measure(np.ones((1, 2)), np.array([[1.0, -1.0]]))  # 2 elements, mean_abs 1.0, cosine 0
    m = combine([a, b])
    assert m.values["max_abs"] == pytest.approx(2.0)
    assert m.values["cosine"] == pytest.approx(0.0)
    assert m.values["mean_abs"] == pytest.approx((0.1 * 4 + 1.0 * 2) / 6)
    assert m.elements == 6


def test_threshold_none_is_informational() -> None:
    resolved = thresholds_for(Tolerance(max_abs=1e-3), "hidden")
    assert resolved["max_abs"] == (1e-3, False)
    assert resolved["cosine"] == (None, True)


def test_per_output_override_replaces_only_fields_it_sets() -> None:
    tol = Tolerance(max_abs=1e-3, cosine=0.99, outputs={"pooled": Tolerance(max_abs=0.5)})
    assert thresholds_for(tol, "pooled")["max_abs"] == (0.5, False)
    assert thresholds_for(tol, "pooled")["cosine"] == (0.99, False)
    assert thresholds_for(tol, "hidden")["max_abs"] == (1e-3, False)
    informational = Tolerance(max_abs=1e-3, outputs={"pooled": Tolerance(informational=["max_abs"])})
    assert thresholds_for(informational, "pooled")["max_abs"] == (1e-3, True)
    assert thresholds_for(informational, "hidden")["max_abs"] == (1e-3, False)


def test_a_threshold_written_for_an_output_gates_unless_that_output_says_informational() -> None:
    tol = Tolerance(
        max_abs=1.0, cosine=0.9, informational=["max_abs"], outputs={"pooled": Tolerance(max_abs=0.5)}
    )
    assert thresholds_for(tol, "pooled")["max_abs"] == (0.5, False)
    assert thresholds_for(tol, "hidden")["max_abs"] == (1.0, True)
    own = Tolerance(max_abs=1.0, outputs={"pooled": Tolerance(max_abs=0.5, informational=["max_abs"])})
    assert thresholds_for(own, "pooled")["max_abs"] == (0.5, True)


def test_override_changes_the_verdict() -> None:
    ref = {"opt": [{"pooled": REF}]}
    got = {"opt": [{"pooled": OUT}]}
    strict = Tolerance(max_abs=0.1)
    assert not evaluate(ArtifactAccuracy("a", "fp32", "x"), ref, got, ["pooled"], strict)
    loose = Tolerance(max_abs=0.1, outputs={"pooled": Tolerance(max_abs=2.0)})
    assert evaluate(ArtifactAccuracy("a", "fp32", "x"), ref, got, ["pooled"], loose)


def test_informational_metric_does_not_gate() -> None:
    tol = Tolerance(max_abs=0.1, cosine=0.9, informational=["max_abs"])
    acc = evaluate(
        ArtifactAccuracy("a", "fp16", "x"), {"opt": [{"y": REF}]}, {"opt": [{"y": OUT}]}, ["y"], tol
    )
    failing = [c for c in acc.checks if not c.passed]
    assert [c.metric for c in failing] == ["max_abs"] and failing[0].informational
    assert acc and acc.reason is None


def test_nan_is_a_failed_check_with_a_reason_even_when_all_metrics_are_informational() -> None:
    bad = OUT.copy()
    bad[0, 0] = np.nan
    bad[1, 1] = np.inf
    tol = Tolerance(informational=["max_abs", "mean_abs", "max_rel", "cosine"])
    acc = evaluate(
        ArtifactAccuracy("a", "fp16", "x"), {"max": [{"y": REF}]}, {"max": [{"y": bad}]}, ["y"], tol
    )
    assert not acc
    finite = next(c for c in acc.checks if c.metric == FINITE)
    assert finite.value == 2 and not finite.passed and not finite.informational
    assert "y" in acc.reason and "NaN" in acc.reason and "max" in acc.reason
    json.dumps(acc.to_json(), allow_nan=False)  # no NaN leaks into the report


def test_reason_names_worst_failing_check() -> None:
    checks = [
        Check("hidden", "opt", "max_abs", 0.002, 0.001, False, False),  # 2x over
        Check("sentence_embedding", "opt", "cosine", 0.91, 0.98, False, False),  # 4.5x the allowed gap
        Check("hidden", "data", "max_rel", 5.0, None, True, True),
    ]
    acc = ArtifactAccuracy("onnx-fp16", "fp16", "onnxruntime-cpu", checks)
    assert not acc
    assert acc.reason.startswith("sentence_embedding cosine 0.91 < 0.98 at opt")
    assert "1 more" in acc.reason


def test_describe_shows_enough_digits() -> None:
    check = Check("y", "opt", "cosine", 0.99985, 0.9999, False, False)
    assert check.describe() == "y cosine 0.99985 < 0.9999 at opt"


def test_truthiness() -> None:
    ok = Check("y", "opt", "max_abs", 0.0, 0.1, True, False)
    assert ArtifactAccuracy("a", "fp32", "x", [ok])
    assert not ArtifactAccuracy("a", "fp32", "x", [])
    assert not ArtifactAccuracy("a", "fp32", "x", [ok], error="boom")
    assert ArtifactAccuracy("a", "fp32", "x", [ok]).to_json()["passed"] is True


def test_checks_for_reports_every_metric() -> None:
    checks = checks_for("y", "data", measure(REF, REF), Tolerance(max_abs=1e-3, cosine=0.999))
    assert [c.metric for c in checks] == [FINITE, "max_abs", "mean_abs", "max_rel", "cosine"]
    mean = next(c for c in checks if c.metric == "mean_abs")
    assert mean.threshold is None and mean.informational and mean.passed
    assert set(checks[1].to_json()) == {
        "output",
        "inputs",
        "metric",
        "value",
        "threshold",
        "passed",
        "informational",
        "scale",  # REF's largest |value| is above 1: the absolute threshold was scaled by it
    }


def test_absolute_thresholds_scale_with_the_output() -> None:
    """A logit of 200 carries float rounding of about 1e-5 per operation: max_abs 1e-3 is judged as 0.2 there,
    while cosine and max_rel are scale-free."""
    big = np.full((2, 3), 200.0)
    close = big + 0.05
    checks = {
        c.metric: c for c in checks_for("y", "opt", measure(big, close), Tolerance(max_abs=1e-3, cosine=0.9))
    }
    assert checks["max_abs"].passed and checks["max_abs"].threshold == pytest.approx(0.2)
    assert checks["max_abs"].scale == 200.0 and checks["max_abs"].to_json()["scale"] == 200.0
    assert checks["cosine"].scale == 1.0 and checks["cosine"].threshold == 0.9
    small = checks_for("y", "opt", measure(big / 400, close / 400), Tolerance(max_abs=1e-3))
    assert next(c for c in small if c.metric == "max_abs").threshold == 1e-3  # below unit scale: as written


def test_nan_in_one_data_batch_fails_the_aggregate() -> None:
    bad = OUT.copy()
    bad[1, 0] = np.nan
    tol = Tolerance(max_abs=10.0, cosine=0.1)
    ref = {"data": [{"y": REF}, {"y": REF}]}
    acc = evaluate(ArtifactAccuracy("a", "fp32", "x"), ref, {"data": [{"y": OUT}, {"y": bad}]}, ["y"], tol)
    assert not acc
    assert acc.reason.startswith("y has 1 NaN/inf values at data")
    assert all(c.value is None for c in acc.checks if c.metric in ("max_abs", "cosine"))


def test_masked_comparison_ignores_padded_positions() -> None:
    ref = np.ones((2, 4, 3))
    got = ref.copy()
    got[0, 3] = 50.0  # garbage where sample 0 is padding
    got[1, 2:] = -7.0  # and where sample 1 is
    mask = np.array([[1, 1, 1, 0], [1, 1, 0, 0]])
    masked = measure(ref, got, mask)
    assert masked.values["max_abs"] == 0.0 and masked.values["cosine"] == pytest.approx(1.0)
    assert masked.elements == 5 * 3
    unmasked = measure(ref, got)
    assert unmasked.values["max_abs"] == pytest.approx(49.0)
    got[1, 1] = 2.0  # a real token that differs is still seen
    assert measure(ref, got, mask).values["max_abs"] == pytest.approx(1.0)


def test_mask_applies_only_to_per_token_outputs() -> None:
    mask = np.array([[1, 0, 0, 0]])
    pooled = np.ones((1, 4))  # 2-D, width equal to the sequence length: not per token
    assert measure(pooled, pooled * 2, mask).values["max_abs"] == pytest.approx(1.0)


def test_neighbour_agreement_counts_kept_neighbours() -> None:
    rng = np.random.default_rng(0)
    emb = rng.normal(size=(12, 8))
    assert neighbour_agreement(emb, emb * 2.0, k=3) == 1.0
    shuffled = rng.normal(size=(12, 8))
    assert neighbour_agreement(emb, shuffled, k=3) < 0.6
    assert neighbour_agreement(emb[:3], emb[:3], k=3) is None


def test_neighbour_check_is_informational_unless_a_threshold_is_set() -> None:
    rng = np.random.default_rng(1)
    emb = rng.normal(size=(8, 4))
    ref = {"data": [{"pooled": emb[:4]}, {"pooled": emb[4:]}]}
    got = {"data": [{"pooled": emb[:4]}, {"pooled": rng.normal(size=(4, 4))}]}
    info = evaluate(ArtifactAccuracy("a", "int8", "x"), ref, got, ["pooled"], Tolerance(max_abs=100.0))
    (check,) = [c for c in info.checks if c.metric == "neighbours"]
    assert check.informational and check.threshold is None and 0 <= check.value < 1
    gated = evaluate(
        ArtifactAccuracy("a", "int8", "x"), ref, got, ["pooled"], Tolerance(max_abs=100.0, neighbours=0.99)
    )
    assert not gated and "neighbours" in gated.reason


def test_per_token_scores_and_single_scores_get_no_neighbour_check() -> None:
    """2-D outputs that are no embedding: per-token scores whose width follows each batch's length (the data
    split's batches differ in it: concatenating them crashed the deploy), and one score per sample."""
    rng = np.random.default_rng(2)
    ref = {"data": [{"scores": rng.normal(size=(4, 13))}, {"scores": rng.normal(size=(4, 2))}]}
    info = evaluate(ArtifactAccuracy("a", "fp16", "x"), ref, ref, ["scores"], Tolerance(max_abs=1.0))
    assert info and {c.metric for c in info.checks} >= {"max_abs", "cosine"}
    assert not [c for c in info.checks if c.metric == "neighbours"]
    one = {"data": [{"score": rng.normal(size=(8, 1))}]}
    info = evaluate(ArtifactAccuracy("a", "fp16", "x"), one, one, ["score"], Tolerance(max_abs=1.0))
    assert not [c for c in info.checks if c.metric == "neighbours"]


def test_a_score_or_a_label_is_gated_by_its_absolute_error_not_its_sign() -> None:
    """One value per sample ([batch, 1] scores) and integer labels: per-sample cosine is 1 whenever the signs
    agree, so an FP16 graph 2.0 off on every score and flipping labels passed. max_abs gates them instead
    (cosine only informs: a flag flipped from 0 to 1 has cosine 0, a class 3 read as 4 cosine 1), and at 0
    for integer values."""
    fp16 = Tolerance(max_abs=5e-2, cosine=0.999, informational=["max_abs"])
    int8 = Tolerance(max_abs=1.0, cosine=0.98, informational=["max_abs"])
    score = np.array([[10.05], [9.8], [10.3], [9.9]], np.float32)
    label = np.array([30, 1, 0, 2], np.int64)
    ref = {"data": [{"score": score, "label": label}]}
    got = {"data": [{"score": score - 2.0, "label": np.array([31, 1, 0, 2], np.int64)}]}
    info = evaluate(ArtifactAccuracy("a", "fp16", "x"), ref, got, ["score", "label"], fp16)
    assert not info
    failing = {(c.output, c.metric) for c in info.failures()}
    assert failing == {("score", "max_abs"), ("label", "max_abs")}, info.reason
    (label_check,) = [c for c in info.checks if (c.output, c.metric) == ("label", "max_abs")]
    assert (
        label_check.threshold == 0
    )  # not 5e-2 x 30, nor 5e-2: a class id is no magnitude, and any change is wrong
    assert all(c.informational for c in info.checks if c.metric == "cosine")
    assert evaluate(ArtifactAccuracy("a", "fp16", "x"), ref, ref, ["score", "label"], fp16)
    # a flag flipped at INT8: its max_abs of 1 fails it (exact for integers); its cosine of 0 only informs
    flag = np.array([0, 1, 1, 0, 1], np.int64)
    info = evaluate(
        ArtifactAccuracy("a", "int8", "x"), {"opt": [{"f": flag}]}, {"opt": [{"f": 1 - flag}]}, ["f"], int8
    )
    assert not info and {(c.output, c.metric) for c in info.failures()} == {("f", "max_abs")}
    # a class read as its neighbour (3 as 4) under INT8's max_abs of 1: it passed, as if labels had a scale
    labels = np.array([3, 7, 1, 9], np.int64)
    info = evaluate(
        ArtifactAccuracy("a", "int8", "x"),
        {"opt": [{"label": labels}]},
        {"opt": [{"label": labels + np.array([1, 0, 0, 0])}]},
        ["label"],
        int8,
    )
    assert not info and ("label", "max_abs") in {(c.output, c.metric) for c in info.failures()}, info.reason
    assert "label max_abs 1 > 0 at opt" in info.reason
    # a per-output tolerance is the way to allow more, and the rule leaves it as written
    loose = Tolerance(max_abs=1.0, cosine=0.9, outputs={"label": {"max_abs": 1.0}})
    assert evaluate(
        ArtifactAccuracy("a", "int8", "x"),
        {"opt": [{"label": labels}]},
        {"opt": [{"label": labels + np.array([1, 0, 0, 0])}]},
        ["label"],
        loose,
    )
    # an embedding keeps its cosine gate, and max_abs stays informational for it
    emb = np.random.default_rng(3).normal(size=(4, 8))
    info = evaluate(
        ArtifactAccuracy("a", "fp16", "x"), {"opt": [{"e": emb}]}, {"opt": [{"e": emb + 0.2}]}, ["e"], fp16
    )
    gates = {c.metric: c.informational for c in info.checks if c.metric in ("cosine", "max_abs")}
    assert gates == {"cosine": False, "max_abs": True}


def test_per_token_integer_outputs_are_judged_like_other_integer_outputs() -> None:
    ids = np.arange(24, dtype=np.int64).reshape(2, 4, 3)
    mask = np.array([[1, 1, 1, 0], [1, 1, 0, 0]])
    fp16 = Tolerance(max_abs=5e-2, cosine=0.999, informational=["max_abs"])
    info = evaluate(
        ArtifactAccuracy("a", "fp16", "x"),
        {"opt": [{"ids": ids}]},
        {"opt": [{"ids": ids + 1}]},
        ["ids"],
        fp16,
        {"opt": [mask]},
    )
    assert ("ids", "max_abs") in {(c.output, c.metric) for c in info.failures()}


def test_artifact_entry_keeps_a_verdict_per_runtime() -> None:
    good = ArtifactAccuracy(
        "a", "fp16", "onnxruntime-cpu", [Check("y", "opt", "cosine", 1.0, 0.9, True, False)]
    )
    bad = ArtifactAccuracy(
        "a", "fp16", "onnxruntime-cuda", [Check("y", "opt", "cosine", 0.5, 0.9, False, False)]
    )
    entry = artifact_entry([good, bad])
    assert entry["passed"] is False and entry["reason"].startswith("on onnxruntime-cuda: y cosine 0.5 < 0.9")
    record = AccuracyRecord.read("a", entry)
    assert record.passed_on("onnxruntime-cpu") and not record.passed_on("onnxruntime-cuda")
    assert not record.passed_on("tensorrt") and record.passed_anywhere and not record.passed
    assert [c.runtime for c in record.on("onnxruntime-cuda").checks] == ["onnxruntime-cuda"]
    assert {c["runtime"] for c in entry["checks"]} == {"onnxruntime-cpu", "onnxruntime-cuda"}


def test_a_failing_check_states_its_threshold_as_written() -> None:
    """'y cosine -0.73 < 1' was printed for a 0.9999 gate (three digits rounded it to 1)."""
    check = Check("y", "data", "cosine", -0.73, 0.9999, False, False)
    assert check.describe() == "y cosine -0.73 < 0.9999 at data"
    close = Check("y", "opt", "cosine", 0.99985, 0.9999, False, False)
    assert close.describe() == "y cosine 0.99985 < 0.9999 at opt"
    big = Check("y", "opt", "max_abs", 1000.2, 1000.0, False, False)
    assert big.describe() == "y max_abs 1000.2 > 1000 at opt"


def test_one_value_per_sample_bound_follows_the_precisions_cosine_and_the_outputs_spread() -> None:
    """sqrt(1/c^2 - 1) is the error cosine c allows a vector; the spread is the reference's standard
    deviation, its magnitude when it is constant (a count), 1 when it is all zeros."""
    from pipeline.check.accuracy import output_spread, spread_factor

    assert spread_factor(0.98) == pytest.approx(0.2030, abs=1e-4)
    assert spread_factor(0.999) == pytest.approx(0.0447, abs=1e-4)
    assert output_spread([np.array([[0.2], [0.4]]), np.array([[0.6], [0.8]])]) == pytest.approx(
        np.std([0.2, 0.4, 0.6, 0.8])
    )
    assert output_spread([np.full((4, 1), 24.0)]) == 24.0 and output_spread([np.zeros((3, 1))]) == 1.0
    # a per-output max_abs is the bound as written: the spread rule steps aside
    int8 = Tolerance(
        max_abs=1.0, cosine=0.98, informational=["max_abs"], outputs={"score": {"max_abs": 0.01}}
    )
    ref = np.array([[0.5], [0.52]], np.float32)
    (bound,) = [
        c for c in checks_for("score", "data", measure(ref, ref + 0.02), int8) if c.metric == "max_abs"
    ]
    assert not bound.passed and bound.threshold == pytest.approx(0.01)


def test_an_output_is_one_value_per_sample_only_where_it_is_at_every_input_set() -> None:
    """A ranker's item scores [batch, items] hold one value per sample at a corner where items is 1: they are
    values, gated by cosine, wherever a row holds several; at that corner, where cosine would see only signs,
    max_abs bounds them at the held-out samples' spread, the basis a score has at every input set."""
    rng = np.random.default_rng(0)
    one = rng.standard_normal((2, 1)).astype(np.float32)
    many = rng.standard_normal((4, 5)).astype(np.float32)
    reference = {"min": [{"items": one}], "data": [{"items": many}]}
    actual = {"min": [{"items": -one}], "data": [{"items": many}]}  # every sign flipped at the corner
    fp16 = Tolerance(max_abs=5e-2, cosine=0.999, informational=["max_abs"])
    result = evaluate(
        ArtifactAccuracy("onnx-fp16", "fp16", "onnxruntime-cpu"), reference, actual, ["items"], fp16
    )
    at_min = {c.metric: c for c in result.checks if c.inputs == "min"}
    at_data = {c.metric: c for c in result.checks if c.inputs == "data"}
    assert at_min["cosine"].informational and not at_data["cosine"].informational
    assert not at_min["max_abs"].informational and not at_min["max_abs"].passed
    assert at_min["max_abs"].scale == pytest.approx(np.std(many))  # the held-out spread, not the corner's own
    assert not result.passed
    # a score at every input set keeps its spread-based bound, the held-out samples' spread
    scores = {"min": [{"s": one}], "data": [{"s": many[:, :1]}]}
    result = evaluate(ArtifactAccuracy("onnx-fp16", "fp16", "onnxruntime-cpu"), scores, scores, ["s"], fp16)
    bounds = {c.inputs: c for c in result.checks if c.metric == "max_abs"}
    assert not bounds["min"].informational
    assert bounds["min"].scale == pytest.approx(np.std(many[:, :1])) == bounds["data"].scale


def test_a_logit_near_zero_whose_sign_flips_in_a_batch_of_one_is_within_int8s_bound() -> None:
    """CLIP's logits_per_image is [images, texts]: at a batch of one, one logit. A random-weight CLIP's
    dynamic INT8 graph kept every held-out logit at cosine 0.9993, and turned that corner's logit of 0.027
    into -0.054: cosine -1, and the variant failed. The corner is now bounded by the held-out spread, where a
    shift of 0.08 is well inside INT8's bound; a logit moved by a whole spread still fails."""
    rng = np.random.default_rng(1)
    held_out = (2.0 * rng.standard_normal((4, 4))).astype(np.float32)
    near_zero = np.array([[0.027]], np.float32)
    int8 = Tolerance(max_abs=1.0, cosine=0.98, informational=["max_abs"])

    def judged(corner: float) -> ArtifactAccuracy:
        reference = {"min": [{"logits": near_zero}], "data": [{"logits": held_out}]}
        actual = {
            "min": [{"logits": np.array([[corner]], np.float32)}],
            "data": [{"logits": held_out + 0.01}],
        }
        return evaluate(
            ArtifactAccuracy("int8", "int8", "onnxruntime-cpu"), reference, actual, ["logits"], int8
        )

    flipped = judged(-0.054)
    assert flipped.passed, flipped.reason
    (bound,) = [c for c in flipped.checks if c.inputs == "min" and c.metric == "max_abs"]
    assert not bound.informational and bound.threshold == pytest.approx(0.203 * np.std(held_out), rel=1e-2)
    moved = judged(0.027 + float(np.std(held_out)))
    assert not moved.passed and "logits max_abs" in moved.reason and "at min" in moved.reason


def test_an_incomparable_output_reads_as_one_in_every_report_line() -> None:
    """A data-dependent output (the indices nonzero() keeps) whose count an INT8 graph changed has no number to
    show: the deploy's table, the sign-off's failing checks and the verdict say "not comparable" and why, not
    "comparable — > —"."""
    from pipeline.report.facts import check_text
    from pipeline.report.summary import _accuracy_cell

    acc = evaluate(
        ArtifactAccuracy("a", "int8", "onnxruntime-cpu"),
        {"data": [{"kept": np.zeros((37, 2), np.int64)}]},
        {"data": [{"kept": np.zeros((36, 2), np.int64)}]},
        ["kept"],
        Tolerance(),
    )
    record = AccuracyRecord.read("a", artifact_entry([acc]))
    verdict = record.on("onnxruntime-cpu")
    (check,) = verdict.checks
    assert record.reason == "kept not comparable at data: shape [36, 2] differs from the reference [37, 2]"
    assert check_text(check, with_metric=True) == (
        "not comparable (shape [36, 2] differs from the reference [37, 2]) ✗"
    )
    assert check_text(check) == "no ✗"  # the table's "comparable" column
    assert _accuracy_cell("a", verdict) == "FAIL kept not comparable"


def test_a_batch_of_one_among_larger_ones_is_still_bounded() -> None:
    """Held-out data grouped by shape leaves batches of one: CLIP's logits [1, 1] beside [4, 4]. The set's
    cosine comes from the larger batch; the batch of one keeps the score's bound, so a logit moved by a whole
    spread fails there while one near zero that flips its sign does not."""
    rng = np.random.default_rng(2)
    many = (2.0 * rng.standard_normal((4, 4))).astype(np.float32)
    one = np.array([[0.027]], np.float32)
    int8 = Tolerance(max_abs=1.0, cosine=0.98, informational=["max_abs"])

    def judged(corner: float) -> ArtifactAccuracy:
        reference = {"data": [{"logits": one}, {"logits": many}]}
        actual = {"data": [{"logits": np.array([[corner]], np.float32)}, {"logits": many + 0.01}]}
        return evaluate(
            ArtifactAccuracy("int8", "int8", "onnxruntime-cpu"), reference, actual, ["logits"], int8
        )

    flipped = judged(-0.054)
    assert flipped.passed, flipped.reason
    bounds = [c for c in flipped.checks if c.metric == "max_abs" and not c.informational]
    spread = np.std(np.concatenate([one.ravel(), many.ravel()]))  # every held-out value
    assert len(bounds) == 1 and bounds[0].threshold == pytest.approx(0.203 * spread, rel=1e-2)
    moved = judged(0.027 + 3 * float(np.std(many)))
    assert not moved.passed and "logits max_abs" in moved.reason


def test_an_output_on_another_dim_than_the_mask_is_compared_at_every_position() -> None:
    """A hold-out Marian's decoder logits [batch, tgt, vocab] had the shape of its encoder's mask [batch, src]
    wherever tgt and src had one size, and were compared on the encoder's real tokens only: a decoder wrong past
    position 4 passed. An output follows the mask where its axis 1 had the mask dim's size, and no other dim's,
    in every batch; the encoder's states, which do, stay masked."""
    from pipeline.check.accuracy import off_the_mask_axis, second_axis_dims

    rng = np.random.default_rng(0)
    mask = np.array([[1] * 4 + [0] * 4] * 2)  # src 8, four real tokens each
    logits, states = rng.standard_normal((2, 8, 5)), rng.standard_normal((2, 8, 3))
    wrong = logits.copy()
    wrong[:, 4:] *= -1  # the decoder's positions past the encoder's real tokens
    reference = {"opt": [{"logits": logits, "states": states}]}
    tied = {"opt": [{"batch": 2, "src": 8, "tgt": 8}]}  # every batch has src = tgt
    unmasked = off_the_mask_axis(reference, tied, "src", "batch")
    assert unmasked == {"logits", "states"}  # axis 1 could follow either dim in both: each compared whole
    # what the validation warns of: the dims each output's second axis could follow
    assert second_axis_dims(reference, tied, "batch") == {"logits": {"src", "tgt"}, "states": {"src", "tgt"}}
    apart = {"opt": [{"batch": 2, "src": 8, "tgt": 8}], "data": [{"batch": 2, "src": 6, "tgt": 3}]}
    reference["data"] = [{"logits": logits[:, :3], "states": states[:, :6]}]
    assert off_the_mask_axis(reference, apart, "src", "batch") == {"logits"}  # states follow src alone
    assert off_the_mask_axis(reference, apart, None, "batch") == frozenset()  # a fixed mask axis: shape alone
    one = {"opt": [{"logits": logits}]}
    masks = {"opt": [mask]}
    tol = Tolerance(cosine=0.99, max_abs=None)
    caught = evaluate(
        ArtifactAccuracy("a", "fp32", "x"),
        one,
        {"opt": [{"logits": wrong}]},
        ["logits"],
        tol,
        masks,
        unmasked=unmasked,
    )
    assert not caught and "logits cosine" in caught.reason
    missed = evaluate(
        ArtifactAccuracy("a", "fp32", "x"), one, {"opt": [{"logits": wrong}]}, ["logits"], tol, masks
    )
    assert missed  # what the shape alone let through
