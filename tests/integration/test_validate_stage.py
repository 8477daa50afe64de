"""The validate stage on real exports of TinyEncoder: ONNX (legacy exporter, dynamic axes) and TorchScript pass,
a corrupted ONNX fails naming output and metric, a broken file fails with its runtime's error, and an engine
(no TensorRT runtime here) lands in not_run."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np
import onnx
import pytest
import torch
from onnx import numpy_helper

from pipeline.bench.matrix import FAILED_VALIDATION
from pipeline.core.artifacts import ArtifactRecord
from pipeline.inputs.models import positional
from pipeline.recipe.loader import load
from pipeline.stages.base import Late
from pipeline.stages.validate import stage
from tests.stage_env import StageEnv

RECIPE = Path(__file__).resolve().parents[1] / "recipes" / "tiny.yaml"
ARTIFACTS = [
    "torchscript-fp32",
    "onnx-fp32",
    "onnx-optimized-fp32",
    "onnx-optimized-fp16",
    "onnx-int8",
    "tensorrt-rtx-fp16",
]
METRICS = ("finite", "max_abs", "mean_abs", "max_rel", "cosine")


def _record(name: str, path: Path, kind: str, precision: str) -> ArtifactRecord:
    return ArtifactRecord(name, path, kind, precision, hashlib.sha256(path.read_bytes()).hexdigest(), "test")


def _example(ctx: StageEnv) -> tuple[torch.Tensor, ...]:
    return positional(ctx.dataset().corner_feeds("opt", batch=2), ctx.model_spec)


def _export_onnx(ctx: StageEnv, path: Path, dynamic: bool = True) -> None:
    recipe = ctx.recipe
    axes = {s.name: {a: d for a, d in enumerate(s.shape) if isinstance(d, str)} for s in recipe.inputs}
    torch.onnx.export(
        ctx.model().module,
        _example(ctx),
        str(path),
        dynamo=False,
        input_names=[s.name for s in recipe.inputs],
        output_names=list(recipe.outputs),
        dynamic_axes=axes if dynamic else None,
        opset_version=18,
    )


def _corrupt(source: Path, target: Path) -> None:
    """Scale the largest float initializer (the token embedding) by 1.5: a real, silent accuracy bug."""
    model = onnx.load(str(source))
    weights = [i for i in model.graph.initializer if i.data_type == onnx.TensorProto.FLOAT]
    biggest = max(weights, key=lambda i: int(np.prod(i.dims)))
    biggest.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(biggest) * 1.5, biggest.name))
    onnx.save(model, str(target))


@pytest.fixture(scope="module")
def validated(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict, object, list[str], Path]:
    loaded = load(RECIPE)
    ctx = StageEnv(loaded.recipe, RECIPE.parent, tmp_path_factory.mktemp("validate"))
    module = ctx.model().module
    with torch.no_grad():
        traced = torch.jit.trace(module, _example(ctx), check_trace=False)
    torch.jit.save(traced, str(ctx.path("model.ts")))
    _export_onnx(ctx, ctx.path("model.onnx"))
    _corrupt(ctx.path("model.onnx"), ctx.path("model.optimized.onnx"))
    _export_onnx(ctx, ctx.path("model.optimized.fp16.onnx"), dynamic=False)  # fixed at the opt shape
    ctx.path("model.int8.onnx").write_bytes(b"not an onnx model")
    ctx.path("model.tensorrt-rtx.fp16.engine").write_bytes(b"\0" * 64)
    inputs = {
        "torchscript-fp32": _record("torchscript-fp32", ctx.path("model.ts"), "torchscript", "fp32"),
        "onnx-fp32": _record("onnx-fp32", ctx.path("model.onnx"), "onnx", "fp32"),
        "onnx-optimized-fp32": _record(
            "onnx-optimized-fp32", ctx.path("model.optimized.onnx"), "onnx", "fp32"
        ),
        "onnx-optimized-fp16": _record(
            "onnx-optimized-fp16", ctx.path("model.optimized.fp16.onnx"), "onnx", "fp16"
        ),
        "onnx-int8": _record("onnx-int8", ctx.path("model.int8.onnx"), "onnx", "int8"),
        "tensorrt-rtx-fp16": _record(
            "tensorrt-rtx-fp16", ctx.path("model.tensorrt-rtx.fp16.engine"), "engine", "fp16"
        ),
    }
    # as in a deploy with a background build: one input arrives late (built), one late and then failed
    built = inputs["torchscript-fp32"]
    inputs["torchscript-fp32"] = Late("torchscript-fp32", lambda: built)
    inputs["onnx-fp16"] = Late("onnx-fp16", lambda: None)
    messages: list[str] = []
    ctx.ctx.report = messages.append
    st = stage(loaded.recipe, RECIPE.parent, ARTIFACTS + ["onnx-fp16"])
    result = ctx.run(st, inputs)
    report = json.loads((ctx.workdir / "reports" / "accuracy.json").read_text())
    return report, result, messages, ctx.workdir


def test_late_inputs_are_checked_after_the_others_and_reported_in_recipe_order(validated) -> None:
    report, result, messages, _ = validated
    waits = [i for i, m in enumerate(messages) if m.startswith("validate: waiting for")]
    assert [messages[i] for i in waits] == [
        "validate: waiting for torchscript-fp32 (building in the background)",
        "validate: waiting for onnx-fp16 (building in the background)",
    ]
    onnx_checked = max(i for i, m in enumerate(messages) if m.startswith("validate onnx-fp32"))
    assert onnx_checked < waits[0]  # the built ones first
    assert (
        list(report["artifacts"])[0] == "torchscript-fp32"
        and report["artifacts"]["torchscript-fp32"]["passed"]
    )
    assert result.details["absent"] == ["onnx-fp16"]  # late, then failed: absent


def test_stage_declaration() -> None:
    loaded = load(RECIPE)
    st = stage(loaded.recipe, RECIPE.parent, ARTIFACTS)
    assert st.name == "validate" and st.critical
    assert st.consumes_any == tuple(ARTIFACTS)
    assert {"validation", "data", "model", "runners", "timing"} <= set(st.config.fingerprinted())
    json.dumps(st.config.fingerprinted())


def test_report_follows_the_contract(validated) -> None:
    report, result, _, _ = validated
    assert report["schema_version"] == 1 and report["reference"] == "torch-fp32"
    assert report["reference_runtime"] == "torch-cpu"
    assert [o.path for o in result.outputs] == ["reports/accuracy.json", "reports/matrix.json"]
    assert {o.kind for o in result.outputs} == {"report"}
    # the matrix of work it planned: each artifact validated on exactly the runtimes its accuracy entry records
    matrix = result.outputs[1].value
    assert {a: set(e["runtimes"]) for a, e in report["artifacts"].items()} == {
        a: set(runtimes) for a, runtimes in matrix["validated"].items()
    }
    # every artifact is timed, but those whose runtime raised in validation (timing would only fail again)
    raised = {e["artifact"] for e in matrix["not_timed"] if e["reason"] == FAILED_VALIDATION}
    assert raised == {"onnx-int8", "onnx-optimized-fp16"}  # the two graphs this test damages so they raise
    assert {c["artifact"] for c in matrix["cells"]} == {"torch-fp32", *report["artifacts"]} - raised
    for entry in report["artifacts"].values():
        assert {"passed", "reason", "precision", "runtime", "checks"} <= set(entry)
        for check in entry["checks"]:
            assert {"output", "inputs", "metric", "value", "threshold", "passed", "informational"} <= set(
                check
            )
    assert result.details["absent"] == ["onnx-fp16"]


@pytest.mark.parametrize("name", ["torchscript-fp32", "onnx-fp32"])
def test_faithful_exports_pass_with_small_errors(validated, name: str) -> None:
    report, _, _, _ = validated
    entry = report["artifacts"][name]
    assert entry["passed"] is True and entry["reason"] is None, entry["reason"]
    assert entry["precision"] == "fp32"
    seen = {(c["output"], c["inputs"], c["metric"]) for c in entry["checks"]}
    for output in ("hidden", "pooled"):
        for inputs in ("min", "opt", "max", "data"):
            assert {(output, inputs, m) for m in METRICS} <= seen
    max_abs = [c["value"] for c in entry["checks"] if c["metric"] == "max_abs"]
    assert max(max_abs) < 1e-4
    cosines = [c["value"] for c in entry["checks"] if c["metric"] == "cosine"]
    assert min(cosines) > 0.99999


def test_corrupted_onnx_fails_naming_output_and_metric(validated) -> None:
    report, result, _, _ = validated
    entry = report["artifacts"]["onnx-optimized-fp32"]
    assert entry["passed"] is False
    assert entry["runtime"] == "onnxruntime-cpu"
    first = entry["reason"].split()
    assert first[0] in ("hidden", "pooled") and first[1] in ("max_abs", "cosine", "mean_abs", "max_rel")
    assert any(c["metric"] == "max_abs" and not c["passed"] for c in entry["checks"])
    assert "onnx-optimized-fp32" in result.details["failed"]


def test_unloadable_artifact_fails_with_the_runtime_error(validated) -> None:
    report, _, _, _ = validated
    entry = report["artifacts"]["onnx-int8"]
    assert entry["passed"] is False and entry["checks"] == []
    assert entry["reason"].startswith("onnxruntime-cpu failed loading:")
    assert "protobuf" in entry["reason"].lower()


def test_runtime_error_during_inference_fails_the_artifact_not_the_stage(validated) -> None:
    report, _, _, _ = validated
    entry = report["artifacts"]["onnx-optimized-fp16"]  # static shapes: the runtime refuses other corners
    assert entry["passed"] is False and entry["runtime"] == "onnxruntime-cpu"
    assert entry["reason"].startswith("onnxruntime-cpu failed at min (input_ids[1, 4] attention_mask[1, 4]):")
    assert "dimension" in entry["reason"].lower()


def test_engine_is_not_run_with_a_reason(validated) -> None:
    report, _, _, _ = validated
    not_run = {n["artifact"]: n["reason"] for n in report["not_run"]}
    assert "tensorrt-rtx-fp16" in not_run and not_run["tensorrt-rtx-fp16"]
    assert "tensorrt-rtx-fp16" not in report["artifacts"]


def test_polygraphy_verdict_is_recorded(validated) -> None:
    report, _, _, _ = validated
    verdict = report["artifacts"]["onnx-fp32"]["runtimes"]["onnxruntime-cpu"]["polygraphy"]
    assert set(verdict) == {"hidden", "pooled"}
    assert all(v["passed"] for v in verdict.values())
    corrupted = report["artifacts"]["onnx-optimized-fp32"]["runtimes"]["onnxruntime-cpu"]
    assert corrupted["polygraphy"]["hidden"]["passed"] is False and corrupted["passed"] is False


def test_progress_names_artifact_and_corner(validated) -> None:
    _, _, messages, _ = validated
    assert any(m.startswith("validate onnx-fp32 on onnxruntime-cpu at max") for m in messages)
    assert any(m.startswith("validate torch-fp32 at data") for m in messages)


def test_adapter_exposes_recipe_io_to_polygraphy(validated) -> None:
    from polygraphy.comparator import Comparator

    from pipeline.runners.polygraphy_adapter import PolygraphyRunner
    from pipeline.runners.registry import runners_for

    loaded = load(RECIPE)
    ctx = StageEnv(loaded.recipe, RECIPE.parent, validated[3])
    record = _record("onnx-fp32", ctx.workdir / "model.onnx", "onnx", "fp32")
    calls: list[int] = []
    adapter = PolygraphyRunner(runners_for(record, ctx.settings)[0], ctx.settings, calls.append)
    with adapter:
        meta = adapter.get_input_metadata(use_numpy_dtypes=False)
        assert [list(m.shape) for m in meta.values()] == [["batch", "sequence"], ["batch", "sequence"]]
    feeds = ctx.dataset().feeds_at({"batch": 3, "sequence": 5})
    results = Comparator.run([adapter], data_loader=[feeds, feeds])
    ((_, iterations),) = results.items()
    assert list(iterations[0]) == ["hidden", "pooled"]
    assert iterations[1]["hidden"].shape == (3, 5, 64)
    assert calls == [0, 1] and not adapter.is_active


def test_a_failing_onnx_artifact_says_where_it_first_diverges(validated) -> None:
    report, _, _, _ = validated
    found = report["artifacts"]["onnx-optimized-fp32"]["runtimes"]["onnxruntime-cpu"]["divergence"]
    # the corruption scaled the token embedding: the embedding lookup is the first node to differ
    assert found["op_type"] == "Gather" and found["text"].startswith("first diverges at")
    assert "divergence" not in report["artifacts"]["onnx-fp32"]["runtimes"]["onnxruntime-cpu"]


def test_per_runtime_records_and_coverage(validated) -> None:
    report, _, _, _ = validated
    entry = report["artifacts"]["onnx-fp32"]
    assert set(entry["runtimes"]) == {"onnxruntime-cpu"} and entry["runtimes"]["onnxruntime-cpu"]["passed"]
    assert all(c["runtime"] == "onnxruntime-cpu" for c in entry["checks"])
    pooled = [c for c in entry["checks"] if c["metric"] == "neighbours"]
    assert [c["output"] for c in pooled] == ["pooled"] and pooled[0]["value"] == 1.0
    assert pooled[0]["informational"]
    # every corner checked, at batches of 1 and 2 (the benchmark's 1 and 2 among them), so the batch range's max
    # of 8 is not; the tiny recipe's mask is all ones (1..1): the report says both
    assert report["warnings"] == [
        "dims.batch.max (8) is not validated: the largest batch validated is 2 "
        "(validation.corner_batches.opt: 8 would validate it)",
        "input attention_mask: the held-out validation split holds 1 distinct value(s) (1); the artifacts were "
        "not checked on varied values of it",
    ]
    covered = report["inputs"]
    assert covered["input_ids"]["distinct"] > 2 and 1 <= covered["input_ids"]["max"] <= 999
    assert covered["attention_mask"]["held_out_distinct"] == 1


def test_narrowed_corners_warn_for_every_dim() -> None:
    from pipeline.stages.validate import coverage_warnings

    recipe = load(RECIPE, ["validation.corners=[opt]"]).recipe
    assert coverage_warnings(recipe.validation, recipe.dims) == [
        "dims.batch.min is not validated (validation.corners leaves out min)",
        "dims.batch.max is not validated (validation.corners leaves out max)",
        "dims.sequence.min is not validated (validation.corners leaves out min)",
        "dims.sequence.max is not validated (validation.corners leaves out max)",
    ]
