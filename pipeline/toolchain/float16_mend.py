"""What ONNX Runtime's float16 converter (`onnxruntime.transformers.float16`, behind both the FP16 graph and the
optimized FP16 graph) gets wrong in graphs with Loop or If bodies, mended after it ran: an EmbeddingBag exports
as a Loop over bags with an If per bag, and its FP16 graphs were refused by the ONNX checker."""

from __future__ import annotations

import onnx

from pipeline.toolchain import onnx_tools


def mend(graph: onnx.GraphProto) -> None:
    """What ONNX Runtime's float16 converter leaves wrong in a graph with Loop or If bodies, mended (every
    FP16 conversion goes through here): the Casts around a blocked node in a body are appended to the main
    graph, and a body that returns a float initializer as it is returns it float32 under a float16 type."""
    onnx_tools.rehome_subgraph_nodes(graph)
    _returned_initializers_as_declared(graph)


def _returned_initializers_as_declared(graph: onnx.GraphProto) -> None:
    """Convert to float16 each float initializer that a graph or body returns as it is where the converter
    declared that output float16: the converter converts an initializer only for the nodes that read it, so an
    If branch returning a constant (an EmbeddingBag's empty bag) kept float32 under a float16 output. One that
    a node reads too is left as it is: that node was kept in float32 (blocked), and the checker says so."""
    from onnxruntime.transformers.float16 import convert_tensor_float_to_float16

    for body in [graph, *onnx_tools.subgraphs(graph)]:
        float16_outputs = {
            o.name for o in body.output if o.type.tensor_type.elem_type == onnx.TensorProto.FLOAT16
        }
        read = {i for n in body.node for i in onnx_tools.node_inputs(n)}
        for init in body.initializer:
            if init.name in float16_outputs - read and init.data_type == onnx.TensorProto.FLOAT:
                convert_tensor_float_to_float16(init)  # in place
