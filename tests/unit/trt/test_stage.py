"""The engine stages' plan-time behaviour: names, inputs, profiles, fingerprint config, pre-flight."""

from pathlib import Path

import pytest

from pipeline.core.errors import StageError
from pipeline.recipe.loader import load
from pipeline.run.plan import needed_variants
from pipeline.stages import tensorrt as st
from pipeline.toolchain.trt.flavour import module_name, resolve_flavour

TINY = Path(__file__).parents[2] / "recipes" / "tiny.yaml"


def recipe(*overrides: str):
    return load(TINY, ["variants.required=[]", *overrides]).recipe


def by_name(r) -> dict:
    return {s.name: s for s in st.stages(r, TINY.parent, needed_variants(r))}


def test_explicit_variants_name_their_flavour_and_consume_the_onnx_of_their_precision():
    made = by_name(recipe("variants.build=[onnx-fp32, tensorrt-rtx-fp16, tensorrt-int8]"))
    assert set(made) == {"tensorrt-rtx-fp16", "tensorrt-int8"}
    assert made["tensorrt-rtx-fp16"].consumes == ("onnx-fp16",)
    assert made["tensorrt-rtx-fp16"].produces == ("tensorrt-rtx-fp16",)
    assert made["tensorrt-int8"].consumes == ("onnx-int8",)
    assert made["tensorrt-int8"].config.compute_capabilities == ["current"]


def test_engine_variant_follows_the_flavour_setting():
    r = recipe("variants.build=[engine-fp32]")
    flavour = resolve_flavour("auto")
    expected = f"{flavour}-fp32" if flavour else "engine-fp32"
    assert list(by_name(r)) == [expected]
    assert list(by_name(recipe("variants.build=[engine-fp32]", "export.tensorrt.flavour=tensorrt-rtx"))) == [
        "tensorrt-rtx-fp32"
    ]


def test_duplicate_engines_make_one_stage():
    r = recipe("variants.build=[engine-fp16, tensorrt-rtx-fp16]", "export.tensorrt.flavour=tensorrt-rtx")
    assert list(by_name(r)) == ["tensorrt-rtx-fp16"]


def test_profiles_take_recipe_dims_and_per_profile_overrides():
    r = recipe(
        "export.tensorrt.profiles=[{}, {dims: {batch: {min: 16, opt: 32, max: 64}}}]", "dims.batch.max=64"
    )
    small, large = st.engine_profiles(r)
    assert small["input_ids"] == [[1, 4], [2, 16], [64, 32]]
    assert large["attention_mask"] == [[16, 4], [32, 16], [64, 32]]


def test_fingerprint_config_changes_with_every_build_setting():
    base = by_name(recipe("variants.build=[tensorrt-rtx-fp32]"))["tensorrt-rtx-fp32"].config.fingerprinted()
    assert base["compute_capabilities"] == ["sm89"]
    for override in (
        "export.tensorrt.compute_capabilities=[sm86]",
        "export.tensorrt.optimization_level=5",
        "export.tensorrt.workspace_mb=512",
        "dims.sequence.max=64",
        "export.tensorrt.build_timeout_s=60",
    ):
        changed = by_name(recipe("variants.build=[tensorrt-rtx-fp32]", override))["tensorrt-rtx-fp32"].config
        changed = changed.fingerprinted()
        assert changed != base, override
    assert {"flavour", "trt_version", "profiles", "optimization_level", "workspace_mb"} <= set(base)


def test_environment_names_flavour_and_version():
    stage = by_name(recipe("variants.build=[tensorrt-rtx-fp32]"))["tensorrt-rtx-fp32"]
    env = stage.environment()
    assert env["tensorrt_flavour"] == "tensorrt-rtx"
    assert env["tensorrt_version"] == stage.config.trt_version


def test_auto_without_a_builder_fails_at_run_with_the_install_command():
    stage = st._missing_builder_stage("fp16")
    assert stage.name == "engine-fp16"
    with pytest.raises(
        StageError, match=r"no TensorRT builder installed \(pip install 'deploy-pipeline\[tensorrt-rtx\]'"
    ):
        stage.run(None, stage.config, {})


def test_preflight_rejects_sm90_for_rtx_and_checks_profiles():
    r = recipe(
        "variants.build=[tensorrt-rtx-fp32]",
        "export.tensorrt.compute_capabilities=[sm89, sm90]",
        "export.tensorrt.profiles=[{dims: {width: {min: 1, opt: 2, max: 3}, batch: {min: 4, opt: 2, max: 8}}}]",
    )
    problems = dict(st.preflight_problems(r))
    assert "sm90" in problems["export.tensorrt.compute_capabilities[1]"]
    assert "sm89" in problems["export.tensorrt.compute_capabilities[1]"]  # lists what is supported
    assert "not a dynamic dim" in problems["export.tensorrt.profiles[0].dims.width"]
    assert "min <= opt <= max" in problems["export.tensorrt.profiles[0].dims.batch"]


def test_preflight_names_a_missing_explicit_flavour():
    if module_name("tensorrt") is not None:
        pytest.skip("datacenter TensorRT is installed here")
    problems = st.preflight_problems(recipe("variants.build=[onnx-fp32, tensorrt-fp32]"))
    assert problems == [
        (
            "variants.build[1]",
            "'tensorrt-fp32' needs TensorRT, which is not installed (pip install 'deploy-pipeline[tensorrt]')",
        )
    ]
    problems = st.preflight_problems(
        recipe("variants.build=[engine-fp32]", "export.tensorrt.flavour=tensorrt")
    )
    assert problems[0][0] == "export.tensorrt.flavour"


def test_no_engine_variants_no_problems_and_no_stages():
    r = recipe("export.tensorrt.compute_capabilities=[sm90]")
    assert st.preflight_problems(r) == [] and by_name(r) == {}


def test_failure_message_lists_every_parser_error_by_node():
    errors = [
        {
            "message": "m1",
            "node": 3,
            "node_name": "mystery",
            "node_operator": "NoSuchOp",
            "description": "Plugin not found",
        },
        {
            "message": "(deserializeOnnxModel): MODEL_DESERIALIZE_FAILED",
            "node": -1,
            "node_name": None,
            "node_operator": None,
            "description": "x",
        },
    ]
    msg = st.failure_message("tensorrt-rtx-fp32", {"error": "rejected", "parser_errors": errors})
    assert msg == (
        "tensorrt-rtx-fp32: the ONNX parser rejected the graph: node mystery (NoSuchOp): Plugin not found; "
        "(deserializeOnnxModel): MODEL_DESERIALIZE_FAILED"
    )


def test_builder_timeout_is_a_variant_failure(tmp_path):
    job = {"log": str(tmp_path / "b.log"), "result": str(tmp_path / "r.json"), "flavour": "tensorrt-rtx"}
    result = st.run_builder(job, tmp_path, timeout_s=0.01, report=lambda m: None)
    assert not result["ok"] and "build_timeout_s" in result["error"]
    assert result["child"]["returncode"] is None
    assert "builder process output" in (tmp_path / "b.log").read_text()
