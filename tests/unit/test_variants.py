"""The variant-name grammar: every name the recipe accepts parses to the artifact, file and source the output
contract gives it (docs/architecture.md, artifact names and files)."""

from __future__ import annotations

import pytest

from pipeline.core.variants import REFERENCE, VARIANTS, parse, precision_of

CONTRACT_FILES = {
    "torchscript-fp32": "model.ts",
    "onnx-fp32": "model.onnx",
    "onnx-fp16": "model.fp16.onnx",
    "onnx-int8": "model.int8.onnx",
    "onnx-int8-dynamic": "model.int8-dynamic.onnx",
    "onnx-optimized-fp32": "model.optimized.onnx",
    "onnx-optimized-fp16": "model.optimized.fp16.onnx",
    "tensorrt-fp16": "model.tensorrt.fp16.engine",
    "tensorrt-rtx-int8": "model.tensorrt-rtx.int8.engine",
    "exported-fp32": "model.exported.pt2",
    "exported-bf16": "model.exported.bf16.pt2",
    "aoti-fp16": "model.aoti.fp16.pt2",
}


@pytest.mark.parametrize(("name", "file"), CONTRACT_FILES.items())
def test_files_are_the_contracts(name: str, file: str) -> None:
    assert parse(name).file == file


def test_every_name_parses_back_to_itself() -> None:
    for name in VARIANTS:
        variant = parse(name)
        assert variant.name == name and variant.requested == name
        assert name.startswith(variant.format) or variant.format == "engine"
        assert variant.precision in name
        if variant.built_from:
            assert parse(variant.built_from).precision in ("fp32", variant.precision)


def test_engine_requests_take_the_resolved_flavour() -> None:
    auto = parse("engine-int8", "tensorrt-rtx")
    assert (auto.name, auto.flavour, auto.format, auto.built_from) == (
        "tensorrt-rtx-int8",
        "tensorrt-rtx",
        "engine",
        "onnx-int8",
    )
    assert auto.flavour_from_setting and not parse("tensorrt-int8").flavour_from_setting
    unresolved = parse("engine-fp16")
    assert (unresolved.name, unresolved.flavour, unresolved.file) == ("engine-fp16", None, None)


def test_sources_and_simplicity() -> None:
    assert parse("onnx-int8-dynamic").built_from == "onnx-fp32"
    assert parse("aoti-bf16").built_from == "exported-bf16"
    assert parse("onnx-fp32").built_from is None
    ranks = {name: parse(name).transformations for name in VARIANTS}
    assert ranks["onnx-fp32"] == ranks["torchscript-fp32"] == 1
    assert ranks["onnx-fp16"] == ranks["onnx-optimized-fp32"] == 2
    assert ranks["onnx-int8"] == ranks["onnx-int8-dynamic"] == ranks["onnx-optimized-fp16"] == 3
    assert ranks["tensorrt-fp32"] == ranks["aoti-fp16"] == ranks["exported-fp32"] == 4


def test_names_outside_the_grammar() -> None:
    with pytest.raises(ValueError, match="not a variant name"):
        parse("onnx-fp64")
    assert precision_of(REFERENCE) == "fp32" and precision_of("whatever") is None
