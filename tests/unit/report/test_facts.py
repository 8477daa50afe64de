from __future__ import annotations

import math

from pipeline.check.verdicts import CheckRecord, Verdict
from pipeline.report.facts import flag_text, fmt_metric, fmt_ms, key_checks, margin, not_run, shape_text


def _check(metric, value, threshold, passed, info=False):
    return CheckRecord.read(
        {
            "output": "o",
            "inputs": "opt",
            "metric": metric,
            "value": value,
            "threshold": threshold,
            "passed": passed,
            "informational": info,
        }
    )


def _verdict(checks: list[CheckRecord]) -> Verdict:
    return Verdict("onnxruntime-cpu", True, None, "fp32", tuple(checks))


def test_margin_reads_cosine_and_errors_the_same_way():
    assert margin(_check("cosine", 0.99, 0.98, True)) == 0.5000000000000004 or math.isclose(
        margin(_check("cosine", 0.99, 0.98, True)), 0.5
    )
    assert math.isclose(margin(_check("max_abs", 0.2, 0.1, False)), 2.0)
    assert margin(_check("max_abs", float("nan"), 0.1, False)) == math.inf


def test_key_checks_prefer_required_worst_in_metric_order():
    entry = _verdict(
        [
            _check("max_abs", 0.9, 0.1, False, info=True),
            _check("max_abs", 0.05, 0.1, True),
            _check("cosine", 0.999, 0.98, True),
            _check("cosine", 0.985, 0.98, True),
        ]
    )
    picked = key_checks(entry)
    assert list(picked) == ["cosine", "max_abs"]
    assert picked["cosine"].value == 0.985
    assert picked["max_abs"].value == 0.05  # the required one decides, not the informational miss


def test_formatting():
    assert [fmt_ms(v) for v in (0.4123, 3.071, 34.66, 195.2, None)] == ["0.412", "3.07", "34.7", "195", "—"]
    # three significant figures below 0.1 ms too, trailing zeros kept, never a bare trailing point
    assert [fmt_ms(v) for v in (0.02981, 26.02, 0.1, 99.97)] == ["0.0298", "26.0", "0.100", "100"]
    assert fmt_metric("cosine", 0.99999994) == "0.99999994"
    assert fmt_metric("cosine", 0.9712) == "0.971200"
    assert fmt_metric("cosine", 1 - 3e-12) == "1 − 3.0e-12"
    assert fmt_metric("cosine", 1.0) == "1.000000"
    assert fmt_metric("max_abs", float("nan")) == "nan"
    assert shape_text({"a": [1, 128], "b": [1, 128]}) == "1×128"
    assert shape_text({"ids": [1, 128], "pixels": [1, 3, 8, 8]}) == "ids 1×128, pixels 1×3×8×8"


def test_not_run_merges_same_reason():
    acc = {"not_run": [{"artifact": "e", "reason": "no GPU"}]}
    speed = {"not_run": [{"artifact": "e", "reason": "no GPU"}, {"artifact": "f", "reason": "other"}]}
    assert not_run(acc, speed) == [("e", "no GPU", "validation, benchmark"), ("f", "other", "benchmark")]


def test_flags_may_be_strings_or_dicts():
    assert flag_text("plain words") == "plain words"
    flag = {
        "kind": "int8_not_faster",
        "artifact": "onnx-int8",
        "runtime": "onnxruntime-cpu",
        "io": "host",
        "batch": 1,
        "sequence_length": 128,
        "shapes": {"input_ids": [1, 128]},
        "message": "onnx-int8 p50 65.000 ms vs onnx-fp16 30.200 ms: slower",
    }
    assert flag_text(flag) == (
        "int8 not faster: onnx-int8 (onnxruntime-cpu) batch 1, shape 1×128: "
        "onnx-int8 p50 65.000 ms vs onnx-fp16 30.200 ms: slower"
    )


def test_rates_are_whole_and_a_missing_one_is_a_dash() -> None:
    from pipeline.check.speed import figure_text, fmt_rate

    assert [fmt_rate(v) for v in (107965.4, 93.6, None, float("nan"))] == ["107965", "94", "—", "—"]
    assert figure_text(None, "seq/s") == "— seq/s" and figure_text(0.02981, "ms") == "0.0298 ms"


def test_worst_is_the_worst_for_metrics_without_a_threshold():
    """max_rel has no threshold by default: the table showed the first check (99.4) where the worst was 728."""
    entry = _verdict(
        [
            _check("max_rel", 99.4, None, True, info=True),
            _check("max_rel", 728.0, None, True, info=True),
            _check("max_rel", 3.0, None, True, info=True),
            _check("neighbours", 0.9, None, True, info=True),
            _check("neighbours", 0.6, None, True, info=True),
        ]
    )
    picked = key_checks(entry)
    assert picked["max_rel"].value == 728.0 and picked["neighbours"].value == 0.6
