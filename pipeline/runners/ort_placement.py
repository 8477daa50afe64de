"""Which nodes of an ONNX graph ONNX Runtime runs off the execution provider it was asked for.

ONNX Runtime runs a node its chosen provider has no kernel for on the CPU provider, without a word. A
dynamically quantized graph (DynamicQuantizeLinear; MatMulInteger on uint8 activations, where the CUDA kernel
takes int8) then "runs on CUDA" with its matrix products on the CPU and copies in between: 672 ms per batch of
256 on an H200, where the FP32 graph takes 25 ms, and 39 s of a GPU deploy's benchmark spent timing the CPU under
a CUDA label. So before the pipeline offers a runner for a provider, it asks ONNX Runtime where it put each node:
one profiled run of a session on that provider, at the recipe's smallest shapes, names each node's provider.

Nodes ONNX Runtime may put on the CPU on purpose are left out: shape arithmetic (a GPU provider prefers the CPU
for it), i.e. nodes whose every known input and output is an integer or boolean tensor or a float of rank below
2 (a scale computed from a shape), Shape and Size, and nodes of unknown types and ranks. (ONNX Runtime's kernel
registry would answer without a run, but on an onnxruntime-gpu build listing the TensorRT provider its Python
query loads that provider's library, and without TensorRT installed the process crashes: seen on the H200 host.)
"""

from __future__ import annotations

import functools
import json
import tempfile
from collections import Counter
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import onnx

from pipeline.runners.ort_session import CPU_PROVIDER, ORT_TYPES

if TYPE_CHECKING:
    from pipeline.inputs.specs import RunnerSettings

# Shape arithmetic: a GPU provider leaves integer nodes like these to the CPU on purpose, at no cost worth a word
SHAPE_TYPES = frozenset({"tensor(int64)", "tensor(int32)", "tensor(bool)"})
SHAPE_OPS = frozenset({"Shape", "Size"})  # read a tensor's shape only, never its data


def off_provider(path: Path, provider: str, settings: RunnerSettings) -> dict[str, int]:
    """Op type -> how many nodes computing on the model's data (a non-integer tensor of rank 2 or more in or
    out) ONNX Runtime runs off `provider` in the graph at `path` (empty: the provider runs them all)."""
    stat = Path(path).stat()
    shapes = tuple(
        (s.name, tuple(settings.dims[d].min if isinstance(d, str) else d for d in s.shape))
        for s in settings.inputs
        if all(not isinstance(d, str) or d in settings.dims for d in s.shape)
    )
    return dict(_off(str(Path(path).resolve()), stat.st_size, stat.st_mtime_ns, provider, shapes))


def declined_reason(off: dict[str, int], provider: str, version: str) -> str:
    """Why a provider is not offered for a graph, in a sentence the reports carry."""
    nodes = ", ".join(f"{op} ×{n}" for op, n in sorted(off.items()))
    return (
        f"onnxruntime {version} runs {nodes} of this graph off {provider} (no kernel there for them at these "
        "types: they would run on the CPU), so it is not offered for this graph"
    )


@functools.lru_cache(maxsize=64)
def _off(
    path: str, size: int, mtime_ns: int, provider: str, shapes: tuple[tuple[str, tuple[int, ...]], ...]
) -> tuple[tuple[str, int], ...]:
    placed = _placements(path, provider, dict(shapes))
    if placed is None:
        return ()
    model = onnx.load(path, load_external_data=False)
    types = _value_types(_typed_graph(model))
    data_ops = {n.op_type for n in model.graph.node if _on_data(n, types)}
    by_name = {n.name: n for n in model.graph.node if n.name}
    off: Counter[str] = Counter()
    for name, op, where in placed:
        if where == provider:
            continue
        node = by_name.get(name)
        if (node is not None and _on_data(node, types)) or (node is None and op in data_ops):
            off[op] += 1
    return tuple(sorted(off.items()))


def _placements(
    path: str, provider: str, shapes: dict[str, tuple[int, ...]]
) -> list[tuple[str, str, str]] | None:
    """(node name, op type, provider) of every node that ran in one profiled run; None when it cannot run."""
    import onnxruntime as ort

    with tempfile.TemporaryDirectory(prefix="pipeline-placement-") as folder:
        options = ort.SessionOptions()
        options.enable_profiling = True
        options.profile_file_prefix = str(Path(folder) / "run")
        options.log_severity_level = 3
        try:
            providers = [provider] if provider == CPU_PROVIDER else [provider, CPU_PROVIDER]
            session = ort.InferenceSession(path, options, providers=providers)
            feeds = {
                i.name: np.ones(shapes[i.name], dtype=ORT_TYPES.get(i.type, np.float32))
                for i in session.get_inputs()
            }
            session.run(None, feeds)
        except Exception:  # noqa: BLE001 - a graph that cannot run here is the runners' to report, not this check's
            return None
        events = json.loads(Path(session.end_profiling()).read_text())
    return [
        (
            e["name"].removesuffix("_kernel_time"),
            e["args"].get("op_name", "?"),
            e["args"].get("provider", "?"),
        )
        for e in events
        if e.get("cat") == "Node" and e.get("name", "").endswith("_kernel_time")
    ]


def _on_data(node: onnx.NodeProto, types: dict[str, tuple[str, int]]) -> bool:
    """The node reads or writes a tensor of rank 2 or more whose type is not integer shape arithmetic."""
    if node.op_type in SHAPE_OPS:
        return False
    known = [types[name] for name in [*node.input, *node.output] if name in types]
    return any(t not in SHAPE_TYPES and rank >= 2 for t, rank in known)


def _typed_graph(model: onnx.ModelProto) -> onnx.ModelProto:
    """The graph without its weights (initializers become typed inputs), with inferred value types."""
    graph = onnx.GraphProto()
    graph.node.extend(model.graph.node)
    graph.input.extend(model.graph.input)
    graph.output.extend(model.graph.output)
    graph.value_info.extend(model.graph.value_info)
    declared = {i.name for i in graph.input}
    for tensor in model.graph.initializer:
        if tensor.name not in declared:
            graph.input.append(onnx.helper.make_tensor_value_info(tensor.name, tensor.data_type, tensor.dims))
    light = onnx.helper.make_model(graph, opset_imports=model.opset_import, ir_version=model.ir_version)
    light.functions.extend(model.functions)
    try:
        return onnx.shape_inference.infer_shapes(light)
    except Exception:  # noqa: BLE001 - without inferred types, declared ones still decide
        return light


def _value_types(model: onnx.ModelProto) -> dict[str, tuple[str, int]]:
    """Value name -> ('tensor(<elem>)' as ONNX Runtime spells types, rank), where both are known."""
    graph = model.graph
    types: dict[str, tuple[str, int]] = {}
    for value in [*graph.input, *graph.output, *graph.value_info]:
        tensor = value.type.tensor_type
        if value.type.HasField("tensor_type") and tensor.elem_type and tensor.HasField("shape"):
            name = onnx.TensorProto.DataType.Name(tensor.elem_type).lower()
            types[value.name] = (f"tensor({name})", len(tensor.shape.dim))
    return types
