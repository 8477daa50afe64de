"""The sign-off verdict: failures found in run records, validation and benchmark; required variants,
allow_failed, provisional winners and the one-line headline."""

from __future__ import annotations

from dataclasses import dataclass, field

from pipeline.decide.verdict import (
    SHAPE_DEPENDENT,
    VariantFailure,
    branch_warnings,
    decide,
    shape_warnings,
    stage_warnings,
    variant_failures,
)


@dataclass
class Record:
    name: str
    status: str
    error: str | None = None
    produces: list[str] = field(default_factory=list)
    details: dict = field(default_factory=dict)


RECORDS = [
    Record("export_onnx", "ran", produces=["onnx-fp32"]),
    Record("optimize_onnx_fp32", "failed", "FileNotFoundError: no such file", ["onnx-optimized-fp32"]),
    Record(
        "tensorrt-rtx-fp16", "skipped", "input unavailable (onnx-fp16: fp16 failed)", ["tensorrt-rtx-fp16"]
    ),
    Record("fp16", "failed", "ValueError: bad", ["onnx-fp16"]),
]
REQUESTED = ["onnx-fp32", "onnx-optimized-fp32", "tensorrt-rtx-fp16", "onnx-int8", "torchscript-fp32"]
ACCURACY = {"artifacts": {"onnx-int8": {"passed": False, "reason": "pooled cosine 0.9 < 0.98 at data"}}}
SPEED = {
    "failed": [
        {
            "artifact": "torchscript-fp32",
            "runtime": "torchscript-cuda",
            "io": "device",
            "batch": 8,
            "reason": "RuntimeError: two devices",
        }
    ]
}


def test_failures_come_from_builds_validation_and_benchmark() -> None:
    failures = variant_failures(REQUESTED, RECORDS, ACCURACY, SPEED)
    assert [(f.artifact, f.stage) for f in failures] == [
        ("onnx-optimized-fp32", "optimize_onnx_fp32"),
        ("tensorrt-rtx-fp16", "tensorrt-rtx-fp16"),
        ("onnx-int8", "validate"),
        ("torchscript-fp32", "benchmark"),
    ]
    assert "onnx-fp16" not in {f.artifact for f in failures}  # built for an engine, not requested itself
    assert failures[3].error == "torchscript-cuda (device I/O), batch 8: RuntimeError: two devices"


def test_failed_variants_are_listed_but_sign_off_holds_by_default() -> None:
    failures = variant_failures(REQUESTED, RECORDS, ACCURACY, SPEED)
    verdict = decide(REQUESTED, [], True, failures, {"reasons": [], "winner": {"artifact": "onnx-fp32"}}, [])
    assert verdict.signed_off and verdict.headline() == "signed off, 4 of 5 variants failed"


def test_allow_failed_false_and_required_failures_fail_the_sign_off() -> None:
    failures = variant_failures(REQUESTED, RECORDS, ACCURACY, SPEED)
    selection = {"reasons": [], "winner": {"artifact": "onnx-fp32"}}
    strict = decide(REQUESTED, [], False, failures, selection, [])
    assert not strict.signed_off and strict.headline() == "NOT signed off"
    assert strict.reasons == [
        "4 of 5 requested variants failed (onnx-optimized-fp32, tensorrt-rtx-fp16, onnx-int8, "
        "torchscript-fp32) and variants.allow_failed is false"
    ]
    required = decide(REQUESTED, ["onnx-int8"], True, failures, selection, [])
    assert required.reasons == [
        "required variant onnx-int8 failed at validate: pooled cosine 0.9 < 0.98 at data"
    ]


def test_provisional_winner_and_selection_reasons() -> None:
    verdict = decide(["onnx-fp32"], [], True, [], {"reasons": [], "winner": {"provisional": True}}, [])
    assert verdict.signed_off and verdict.headline() == "signed off (provisional: winner did not stabilize)"
    none = decide(["onnx-fp32"], [], True, [], {"reasons": ["no artifact passed validation"]}, [])
    assert not none.signed_off and none.reasons == ["no artifact passed validation"]


def test_a_shape_dependent_trace_warns_for_every_other_export() -> None:
    records = [
        Record(
            "export_torchscript",
            "failed",
            "traced module disagrees",
            ["torchscript-fp32"],
            {SHAPE_DEPENDENT: True},
        )
    ]
    [warning] = shape_warnings(records, ["onnx-fp32", "onnx-fp16"])
    assert "depends on the input shape" in warning and warning.endswith("onnx-fp32, onnx-fp16")


def test_exports_failing_where_the_tracer_warned_of_a_branch_name_it() -> None:
    """A model that branches on its data (`if x.mean() > 0`) fails every export at the held-out data while the
    trace check passed at the corners: the failures showed only cosines; the tracer's warning says why."""
    warned = [
        "DeprecationWarning: torch.jit.trace is deprecated",
        "TracerWarning: Converting a tensor to a Python boolean",
    ]
    records = [
        Record(
            "export_torchscript", "ran", produces=["torchscript-fp32"], details={"tracer_warnings": warned}
        )
    ]
    failures = [
        VariantFailure("torchscript-fp32", "validate", "y cosine -0.73 < 0.9999 at data"),
        VariantFailure("onnx-fp32", "validate", "y cosine -0.73 < 0.9999 at data"),
        VariantFailure("onnx-fp16", "fp16", "no node computes in float16"),
    ]
    [warning] = branch_warnings(records, failures)
    assert "Converting a tensor to a Python boolean" in warning
    assert "so onnx-fp32, torchscript-fp32 may fail where the data takes the other path" in warning
    assert branch_warnings(records, failures[2:]) == []  # nothing failed validation: nothing to explain
    quiet = [Record("export_torchscript", "ran", details={"tracer_warnings": warned[:1]})]
    assert branch_warnings(quiet, failures) == []


def test_exports_failing_where_the_tracer_warned_of_a_python_number_say_so() -> None:
    """transformers MobileNetV2 pads as TensorFlow does, by amounts computed in Python from the input's size:
    every export failed at the held-out data's other sizes (cosine 0.683), and the warning spoke of an `if`."""
    warned = ["TracerWarning: Converting a tensor to a Python integer might cause the trace to be incorrect."]
    records = [Record("export_torchscript", "ran", details={"tracer_warnings": warned})]
    failures = [VariantFailure("onnx-fp32", "validate", "logits cosine 0.683 < 0.9999 at data")]
    [warning] = branch_warnings(records, failures)
    assert "a number computed in Python from a tensor or its shape (a padding amount, a size)" in warning
    assert (
        "`if`" not in warning
        and "onnx-fp32 may fail where the data's shapes or values give another" in warning
    )
    branching = [Record("export_pt2", "ran", details={"tracer_warnings": [PYTHON_BOOLEAN]})]
    [both] = branch_warnings([*records, *branching], failures)  # an `if` anywhere is the likelier cause
    assert both.startswith("export_pt2:") and "an `if` on tensor values" in both


PYTHON_BOOLEAN = (
    "TracerWarning: Converting a tensor to a Python boolean might cause the trace to be incorrect."
)


def test_stage_warnings_come_from_stages_that_ran_or_were_reused() -> None:
    records = [
        Record("int8", "ran", details={"warnings": ["symbolic shape inference could not finish"]}),
        Record("fp16", "reused", details={"warnings": ["kept 3 ops in FP32"]}),
        Record("optimize_onnx_fp32", "failed", details={"warnings": ["never seen: the stage failed"]}),
        Record("export_onnx", "ran"),
    ]
    assert stage_warnings(records) == [
        "int8: symbolic shape inference could not finish",
        "fp16: kept 3 ops in FP32",
    ]


def test_a_runner_failing_at_several_batches_for_one_reason_is_one_failure() -> None:
    """The card's "Failed variants" lists each failure once: the batches it failed at are named together."""
    row = {
        "artifact": "onnx-int8",
        "runtime": "onnxruntime-cpu",
        "io": "host",
        "reason": "RuntimeError: no kernel",
    }
    speed = {"failed": [{**row, "batch": 1}, {**row, "batch": 4}, {**row, "batch": 4, "reason": "OOM"}]}
    failures = variant_failures(["onnx-int8"], [], None, speed)
    assert [f.error for f in failures] == [
        "onnxruntime-cpu (host I/O), batches 1, 4: RuntimeError: no kernel",
        "onnxruntime-cpu (host I/O), batch 4: OOM",
    ]
