"""Feed-forward layers are found from the graph's structure, not from BERT's module names: the two linears
around an activation, through elementwise ops and reshapes, for the FFN shapes of the model families users
bring. Attention projections and residual paths are never taken for one."""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from pipeline.toolchain.onnx_tools import feed_forward_nodes, select_nodes

HIDDEN, INNER = 4, 8


class Graph:
    """A small graph builder: linears read named weight initializers, so nodes have readable names."""

    def __init__(self) -> None:
        self.nodes: list[onnx.NodeProto] = []
        self.inits: list[onnx.TensorProto] = []
        self.count = 0

    def op(self, op: str, *inputs: str, name: str | None = None, **attrs: object) -> str:
        self.count += 1
        out = f"v{self.count}"
        self.nodes.append(
            helper.make_node(op, list(inputs), [out], name=name or f"{op}_{self.count}", **attrs)
        )
        return out

    def const(self, name: str, shape: tuple[int, ...]) -> str:
        self.inits.append(numpy_helper.from_array(np.ones(shape, np.float32), name))
        return name

    def linear(self, x: str, name: str, fan_in: int, fan_out: int, gemm: bool = False) -> str:
        weight = self.const(f"{name}.weight", (fan_in, fan_out))
        if gemm:
            return self.op("Gemm", x, weight, name=name)
        return self.op("Add", self.op("MatMul", x, weight, name=name), self.const(f"{name}.bias", (fan_out,)))

    def model(self, x: str, out: str) -> onnx.ModelProto:
        graph = helper.make_graph(
            self.nodes,
            "g",
            [helper.make_tensor_value_info(x, TensorProto.FLOAT, None)],
            [helper.make_tensor_value_info(out, TensorProto.FLOAT, None)],
            self.inits,
        )
        return helper.make_model(graph)


def erf_gelu(g: Graph, x: str) -> str:
    """x * 0.5 * (1 + erf(x / sqrt 2)): how the exporters write BERT's GELU."""
    half = g.const(f"half{g.count}", ())
    one = g.const(f"one{g.count}", ())
    inner = g.op("Add", g.op("Erf", g.op("Div", x, g.const(f"sqrt2_{g.count}", ()))), one)
    return g.op("Mul", g.op("Mul", x, half), inner)


def tanh_gelu(g: Graph, x: str) -> str:
    """GPT-2's NewGELU: 0.5 x (1 + tanh(c (x + 0.044715 x^3)))."""
    cube = g.op("Pow", x, g.const(f"three{g.count}", ()))
    inner = g.op("Add", x, g.op("Mul", cube, g.const(f"k{g.count}", ())))
    return g.op("Mul", x, g.op("Add", g.op("Tanh", g.op("Mul", inner, g.const(f"c{g.count}", ()))), x))


def attention(g: Graph, x: str, prefix: str) -> str:
    """Q, K, V projections, heads split by Reshape and Transpose, scores, softmax, output projection."""
    heads = g.const(f"{prefix}.shape", (3,))
    q, k, v = (
        g.op(
            "Transpose", g.op("Reshape", g.linear(x, f"{prefix}.{n}", HIDDEN, HIDDEN), heads), perm=[1, 0, 2]
        )
        for n in ("query", "key", "value")
    )
    scores = g.op("Softmax", g.op("MatMul", q, g.op("Transpose", k, perm=[0, 2, 1])))
    context = g.op("Reshape", g.op("Transpose", g.op("MatMul", scores, v), perm=[1, 0, 2]), heads)
    return g.linear(context, f"{prefix}.out", HIDDEN, HIDDEN)


def names(model: onnx.ModelProto) -> list[str]:
    return feed_forward_nodes(model)


def test_bert_block_keeps_intermediate_and_output_dense() -> None:
    g = Graph()
    x = g.op("LayerNormalization", "x", g.const("ln.w", (HIDDEN,)))
    h = g.op("Add", attention(g, x, "attn"), x)
    h = g.op("LayerNormalization", h, g.const("ln2.w", (HIDDEN,)))
    up = g.linear(h, "intermediate.dense", HIDDEN, INNER)
    out = g.op("Add", g.linear(erf_gelu(g, up), "output.dense", INNER, HIDDEN), h)
    assert names(g.model("x", out)) == ["intermediate.dense", "output.dense"]


def test_gpt2_conv1d_gemms_between_reshapes() -> None:
    g = Graph()
    shape2d, shape3d = g.const("s2", (2,)), g.const("s3", (3,))
    flat = g.op("Reshape", "x", shape2d)
    up = g.op("Reshape", g.linear(flat, "mlp.c_fc", HIDDEN, INNER, gemm=True), shape3d)
    act = g.op("Reshape", tanh_gelu(g, up), shape2d)
    out = g.op("Reshape", g.linear(act, "mlp.c_proj", INNER, HIDDEN, gemm=True), shape3d)
    assert names(g.model("x", out)) == ["mlp.c_fc", "mlp.c_proj"]


def test_gated_feed_forward_keeps_both_up_projections() -> None:
    """T5 v1.1 and LLaMA-style blocks: act(wi_0 x) * wi_1 x, then wo."""
    g = Graph()
    gate = g.op("Relu", g.linear("x", "wi_0", HIDDEN, INNER))
    value = g.linear("x", "wi_1", HIDDEN, INNER)
    out = g.linear(g.op("Mul", gate, value), "wo", INNER, HIDDEN)
    assert names(g.model("x", out)) == ["wi_0", "wi_1", "wo"]


def test_two_linears_without_an_activation_are_not_a_feed_forward_block() -> None:
    g = Graph()
    out = g.linear(g.linear("x", "a", HIDDEN, INNER), "b", INNER, HIDDEN)
    assert names(g.model("x", out)) == []


def test_attention_and_a_residual_stream_are_left_alone() -> None:
    g = Graph()
    h = g.op("Add", attention(g, "x", "layer0"), "x")
    h2 = g.op("Add", attention(g, g.op("LayerNormalization", h, g.const("ln.w", (HIDDEN,))), "layer1"), h)
    assert names(g.model("x", h2)) == []


def test_selection_keeps_the_feed_forward_layers_in_float_and_says_why() -> None:
    g = Graph()
    x = g.linear("x", "attention.dense", HIDDEN, HIDDEN)
    out = g.linear(g.op("Gelu", g.linear(x, "fc1", HIDDEN, INNER)), "fc2", INNER, HIDDEN)
    model = g.model("x", out)
    selection = select_nodes(model, ["MatMul", "Gemm"], True, exclude_feed_forward=True)
    assert selection.quantize == ["attention.dense"]
    assert selection.feed_forward() == ["fc1", "fc2"]
    assert select_nodes(model, ["MatMul"], True).quantize == ["attention.dense", "fc1", "fc2"]
