"""The optimize_onnx stages on the tiny encoder: ONNX Runtime graphs in FP32 and FP16 that load, keep FP32 I/O
and agree with the eager model."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import onnx
import pytest

from pipeline.core.artifacts import ArtifactRecord
from pipeline.stages.base import Stage
from pipeline.toolchain import onnx_tools
from tests.stage_env import StageEnv
from tests.unit.stages.onnx_fixtures import (
    dynamo_export,
    lowest_cosine,
    reference,
    run_onnx,
    tiny_context,
    tiny_onnx,
)


@pytest.fixture(scope="module")
def source(tmp_path_factory: pytest.TempPathFactory) -> ArtifactRecord:
    return tiny_onnx(tmp_path_factory)


OPTIMIZED = ["onnx-optimized-fp32", "onnx-optimized-fp16"]


def _stages() -> dict[str, Stage]:
    ctx = tiny_context(Path("."))
    return {name: ctx.stage(name, OPTIMIZED) for name in ("optimize_onnx_fp32", "optimize_onnx_fp16")}


def test_two_stages_with_their_artifacts() -> None:
    stages = _stages()
    assert {n: (s.consumes, s.produces) for n, s in stages.items()} == {
        "optimize_onnx_fp32": (("onnx-fp32",), ("onnx-optimized-fp32",)),
        "optimize_onnx_fp16": (("onnx-fp32",), ("onnx-optimized-fp16",)),
    }
    assert stages["optimize_onnx_fp32"].config.fingerprinted()["optimize"] == {
        "model_type": "bert",
        "opt_level": 2,
        "fusions": ["onnxscript", "transformers"],
    }
    assert stages["optimize_onnx_fp32"].config.fp16 is None and stages["optimize_onnx_fp16"].config.fp16


@pytest.mark.parametrize(
    ("name", "file", "precision", "tolerance"),
    [
        ("optimize_onnx_fp32", "model.optimized.onnx", "fp32", 1e-4),
        ("optimize_onnx_fp16", "model.optimized.fp16.onnx", "fp16", 5e-2),
    ],
)
def test_optimized_graph(
    name: str, file: str, precision: str, tolerance: float, source: ArtifactRecord, tmp_path: Path
) -> None:
    ctx = tiny_context(tmp_path)
    out = ctx.run(_stages()[name], {"onnx-fp32": source}).outputs[0]
    assert (out.path, out.artifact, out.precision, out.kind) == (
        file,
        f"onnx-optimized-{precision}",
        precision,
        "onnx",
    )
    assert out.details["target"] == "onnxruntime"
    assert isinstance(out.details["fused_ops"], dict)
    # onnxscript's rewriter fuses the tiny encoder's attention (into MultiHeadAttention: its Q, K and V
    # projections are not packed); the transformers optimizer alone finds none in a dynamo export
    assert out.details["fusions"]["onnxscript"].get("sdpa", 0) == 2, out.details["fusions"]
    contrib = out.details["contrib_ops"]
    assert contrib.get("com.microsoft.MultiHeadAttention", 0) + contrib.get("com.microsoft.Attention", 0) == 2
    model = onnx.load(str(tmp_path / file))
    assert not onnx_tools.has_external_data(model)
    assert {o.type.tensor_type.elem_type for o in model.graph.output} == {onnx.TensorProto.FLOAT}
    if precision == "fp16":
        assert onnx_tools.initializer_dtypes(model).get("FLOAT16", 0) > 0
    feeds = ctx.dataset().feeds_at({"batch": 2, "sequence": 12})
    got, want = run_onnx(tmp_path / file, feeds), reference(ctx, feeds)
    assert abs(got["hidden"] - want["hidden"]).max() < tolerance
    assert lowest_cosine(got["pooled"], want["pooled"]) >= 0.999
    assert (tmp_path / "logs" / f"{name}.log").is_file()


def test_generic_models_get_onnxruntime_graph_optimizations_only(
    source: ArtifactRecord, tmp_path: Path
) -> None:
    ctx = tiny_context(tmp_path, "model.family=generic")
    assert ctx.recipe.export.optimize.model_type is None
    out = ctx.run_named("optimize_onnx_fp32", {"onnx-fp32": source}, variants=OPTIMIZED).outputs[0]
    assert out.details["model_type"] is None
    feeds = ctx.dataset().feeds_at({"batch": 2, "sequence": 12})
    got, want = run_onnx(tmp_path / out.path, feeds), reference(ctx, feeds)
    assert abs(got["hidden"] - want["hidden"]).max() < 1e-4


GPT2 = Path(__file__).resolve().parents[2] / "zoo" / "recipes" / "gpt2.yaml"


@pytest.fixture(scope="module")
def gpt2(tmp_path_factory: pytest.TempPathFactory) -> tuple[Any, ArtifactRecord]:
    """GPT-2 (tiny, random weights) as a user writes its recipe: model_type gpt2, the default fusions."""
    from pipeline.recipe.loader import load

    folder = tmp_path_factory.mktemp("gpt2")
    ctx = StageEnv(load(GPT2, []).recipe, GPT2.parent, folder)
    return ctx, dynamo_export(
        ctx, folder / "model.onnx", ctx.dataset().feeds_at({"batch": 2, "sequence": 16})
    )


@pytest.mark.parametrize("name", ["optimize_onnx_fp32", "optimize_onnx_fp16"])
def test_a_fused_graph_that_fails_its_checks_falls_back_and_says_why(
    name: str, gpt2: tuple[Any, ArtifactRecord], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """On GPT-2 the onnxscript fusions give a Gemm of rank 3 that ONNX Runtime refuses to load, and the
    transformers optimizer's GPT-2 pass crashes on bias-less Gemms: the stage keeps ONNX Runtime's own graph
    optimizations, records both rejections, and the graph it keeps loads and agrees with the model. Nothing
    the tools write lands in the working directory."""
    ctx, source = gpt2
    work = tmp_path / "cwd"
    work.mkdir()
    monkeypatch.chdir(work)
    env = StageEnv(ctx.recipe, ctx.recipe_dir, tmp_path / "out")
    out = env.run_named(name, {"onnx-fp32": source}, variants=OPTIMIZED).outputs[0]
    details = out.details
    assert details["applied"] == "ONNX Runtime's graph optimizations alone", details
    assert [f["attempt"] for f in details["fallback"]] == [
        f"as configured (model_type {ctx.recipe.export.optimize.model_type})",
        "the transformers optimizer alone",
    ]
    assert "rank 2 but has rank 3" in details["fallback"][0]["reason"]
    assert details["warnings"] and "was rejected" in details["warnings"][0]
    # the details say what the kept attempt applied, not what the recipe asked for (model_type gpt2)
    assert (details["model_type"], details["opt_level"]) == (None, 2)
    feeds = env.dataset().feeds_at({"batch": 2, "sequence": 12})
    got, want = run_onnx(tmp_path / "out" / out.path, feeds), reference(env, feeds)
    assert lowest_cosine(got["logits"], want["logits"]) >= 0.999
    assert list(work.iterdir()) == []


def test_the_last_resort_is_onnx_runtimes_basic_optimizations() -> None:
    """Level 2 fuses kernels for the provider the optimizer ran on (a MobileNet's Conv+ReLU6 becomes a FusedConv
    with a Clip activation, which ONNX Runtime's CUDA provider refuses to load); level 1 holds none."""
    from pipeline.recipe import OptimizeExport
    from pipeline.stages.optimize_onnx import attempts

    generic = attempts(OptimizeExport(model_type=None, fusions=["transformers"]))
    assert [(a.label, a.model_type, a.opt_level) for a in generic] == [
        ("as configured", None, None),
        ("ONNX Runtime's basic graph optimizations (level 1)", None, 1),
    ]
    labels = [a.label for a in attempts(OptimizeExport(model_type="bert"))]
    assert labels == [
        "as configured (model_type bert)",
        "the transformers optimizer alone",
        "ONNX Runtime's graph optimizations alone",
        "ONNX Runtime's basic graph optimizations (level 1)",
    ]
    assert len(attempts(OptimizeExport(model_type=None, fusions=["transformers"], opt_level=1))) == 1
