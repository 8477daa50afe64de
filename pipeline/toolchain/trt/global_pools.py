"""Average pools whose window covers their whole input, written as GlobalAveragePool for TensorRT's parser.

transformers' EfficientNet pools its last feature map with `nn.AvgPool2d(hidden_dim, ceil_mode=True)`: a
1280 x 1280 window over a 7 x 7 map, one output per channel, the map's mean. ONNX Runtime runs it; TensorRT
refuses a window that large ("addPoolingNd: ... volume(windowSize) < maxKernelDimsProduct"). Where the input's
spatial sizes are known and every output size is 1 with no padding, the pool is a global average (with
ceil_mode, the window's part past the input is not counted, in ONNX as in PyTorch), and is written as one.
"""

from __future__ import annotations

import math
from pathlib import Path

import onnx


def global_average_pools(model: onnx.ModelProto) -> int:
    """Rewrite such AveragePool nodes in place; returns how many."""
    pools = [n for n in model.graph.node if n.op_type == "AveragePool" and n.domain in ("", "ai.onnx")]
    if not pools:
        return 0  # shape inference over a whole transformer, for nothing
    shapes = _spatial_sizes(model)
    rewritten = 0
    for node in pools:
        sizes = shapes.get(node.input[0])
        if sizes is not None and _covers_its_input(node, sizes):
            node.op_type = "GlobalAveragePool"
            del node.attribute[:]
            rewritten += 1
    return rewritten


def for_tensorrt(source: Path, folder: Path) -> tuple[Path, int]:
    """The graph the builder parses: `source` itself, or a rewritten copy in `folder` and the count."""
    try:
        model = onnx.load(str(source))
        count = global_average_pools(model)
    except Exception:  # noqa: BLE001 - a graph onnx cannot read or infer: the builder says what is wrong with it
        return source, 0
    if not count:
        return source, 0
    target = folder / source.name
    onnx.save(model, str(target))
    return target, count


def _spatial_sizes(model: onnx.ModelProto) -> dict[str, list[int]]:
    """Static spatial sizes (the dims after batch and channels) of every tensor shape inference knows."""
    inferred = onnx.shape_inference.infer_shapes(model)
    found = {}
    for info in [*inferred.graph.value_info, *inferred.graph.input]:
        dims = info.type.tensor_type.shape.dim
        spatial = [d.dim_value if d.HasField("dim_value") else None for d in dims[2:]]
        if spatial and all(s for s in spatial):
            found[info.name] = spatial
    return found


def _covers_its_input(node: onnx.NodeProto, sizes: list[int]) -> bool:
    """True where the window spans every spatial size of the input, without padding or dilation, and gives one
    output per channel: the output-size formula is exactly 1 (with ceil_mode a window past the input still
    gives 1; a stride that small would give none)."""
    attrs = {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}
    kernel = list(attrs.get("kernel_shape", []))
    strides = list(attrs.get("strides", [1] * len(kernel)))
    pads = list(attrs.get("pads", [0] * 2 * len(kernel)))
    auto_pad = attrs.get("auto_pad", b"NOTSET")
    auto_pad = auto_pad.decode() if isinstance(auto_pad, bytes) else auto_pad
    if len(kernel) != len(sizes) or any(pads) or auto_pad not in ("NOTSET", "VALID"):
        return False
    if any(d != 1 for d in attrs.get("dilations", [1] * len(kernel))):
        return False
    rounding = math.ceil if attrs.get("ceil_mode", 0) else math.floor
    return all(
        k >= n and rounding((n - k) / s) + 1 == 1 for n, k, s in zip(sizes, kernel, strides, strict=True)
    )
