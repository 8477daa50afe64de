"""Parsing the layer listing out of the builder's verbose log (the only listing without a GPU)."""

import json

from pipeline.toolchain.trt.layers import (
    is_layer_listing,
    layers_from_inspector,
    layers_from_log,
    parse_layer_line,
)

GEMM = (
    "Name: node_MatMul_30+node_MatMul_22_myl0_2, LayerType: gemm, Inputs: [ { Name: add_11.1_myl0, Dimensions: "
    "[-1,64], Strides: [64,1], StrideOrder: [1,0], Datatype: Float, Format: (Linear) Row major linear format }], "
    "Constants: [ { Name: __mye28051_dconst_myl0, Dimensions: [64,192], Strides: [192,1], StrideOrder: [1,0], "
    "Datatype: Half, Format: (Linear) Row major linear format }], Outputs: [ { Name: __mye28056_myl0, Dimensions: "
    "[-1,192], Strides: [192,1], StrideOrder: [1,0], Datatype: Half, Format: (Linear) Row major linear format }], "
    "TacticName: __myelin_CASK_STUB, StreamId: 0, Metadata: [ONNX Layer: node_MatMul_30]\x1f[ONNX Layer: node_MatMul_22]"
)
SHAPE = "Name: __mye7700_0_myl0_0, LayerType: shape_call, Inputs: [], Constants: [], Outputs: [], TacticName: , StreamId: 0, Metadata: "


def test_parses_a_gemm_line():
    layer = parse_layer_line(GEMM)
    assert layer["name"] == "node_MatMul_30+node_MatMul_22_myl0_2"
    assert layer["type"] == "gemm"
    assert layer["tactic"] == "__myelin_CASK_STUB"
    assert layer["inputs"] == [{"name": "add_11.1_myl0", "dims": "-1,64", "dtype": "Float"}]
    assert layer["outputs"] == [{"name": "__mye28056_myl0", "dims": "-1,192", "dtype": "Half"}]
    assert layer["onnx_nodes"] == ["node_MatMul_30", "node_MatMul_22"]


def test_parses_the_legacy_one_line_form():
    layer = parse_layer_line(
        "Layer(CaskGemm): fc1, Tactic: 0x00000000000003e8, x (Float[1,4]) -> y (Float[1,8])"
    )
    assert (layer["type"], layer["name"], layer["tactic"]) == ("CaskGemm", "fc1", "0x00000000000003e8")
    assert layer["inputs"] == [{"name": "x (Float[1,4])"}]


def test_other_lines_are_not_layers():
    assert parse_layer_line("I/O Tensors:") is None
    assert parse_layer_line("") is None


def test_listing_stops_before_the_io_table_and_uses_the_last_listing():
    first = "Layers:\n" + SHAPE
    final = "Layers:\n" + SHAPE + "\n" + GEMM + "\n\nI/O Tensors:\n Name: input_ids, IOMode: Input"
    assert is_layer_listing(final) and not is_layer_listing("Engine generation completed")
    layers = layers_from_log([first, "unrelated", final])
    assert [layer["type"] for layer in layers] == ["shape_call", "gemm"]
    assert layers_from_log(["no listing here"]) == []


def test_inspector_json_is_normalized():
    info = {
        "Layers": [
            {
                "Name": "fc",
                "LayerType": "gemm",
                "TacticName": "t",
                "Metadata": "[ONNX Layer: mm]",
                "Inputs": [{"Name": "x", "Dimensions": [1, 4], "Format/Datatype": "Float"}],
                "Outputs": [],
            },
            "names-only-layer",
        ]
    }
    layers = layers_from_inspector(json.dumps(info))
    assert layers[0] == {
        "name": "fc",
        "type": "gemm",
        "tactic": "t",
        "onnx_nodes": ["mm"],
        "inputs": [{"name": "x", "dims": "1,4", "dtype": "Float"}],
        "outputs": [],
    }
    assert layers[1]["name"] == "names-only-layer"
