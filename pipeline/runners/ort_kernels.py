"""Which nodes of an ONNX graph an ONNX Runtime execution provider has no kernel for.

ONNX Runtime runs a node its chosen provider has no kernel for on the CPU provider, without a word. A
dynamically quantized graph (DynamicQuantizeLinear; MatMulInteger on uint8 activations, where the CUDA kernel
takes int8) then "runs on CUDA" with its matrix products on the CPU and copies in between: 672 ms per batch of
256 on an H200, where the FP32 graph takes 25 ms, and 39 s of a GPU deploy's benchmark spent timing the CPU under
a CUDA label. So before the pipeline offers a runner for a provider, it asks ONNX Runtime's own kernel registry
(the kernels its build registers, with their opset ranges and type constraints) which nodes that provider lacks.

Types come from ONNX shape inference; where it knows none (outputs of contrib ops), a node is matched by op and
version alone, so a doubt never declines a provider. A build of ONNX Runtime without the registry in its Python
module declines nothing.
"""

from __future__ import annotations

import functools
from collections import Counter
from pathlib import Path
from typing import Any

import onnx

ONNX_DOMAINS = ("", "ai.onnx")
RESOLVED_AT_LOAD = frozenset({"Constant"})  # ONNX Runtime turns these into initializers: no kernel runs them
# Shape arithmetic: a GPU provider leaves integer nodes like these to the CPU on purpose, at no cost worth a word
SHAPE_TYPES = frozenset({"tensor(int64)", "tensor(int32)", "tensor(bool)"})


def missing_kernels(path: Path, provider: str) -> dict[str, int]:
    """Op type -> how many nodes computing on the model's data (a float or 8-bit input or output) `provider`
    has no kernel for, in the graph at `path` (empty: it runs them all; integer shape arithmetic is left out)."""
    stat = Path(path).stat()
    return dict(_missing(str(Path(path).resolve()), stat.st_size, stat.st_mtime_ns, provider))


def declined_reason(missing: dict[str, int], provider: str, version: str) -> str:
    """Why a provider is not offered for a graph, in a sentence the reports carry."""
    nodes = ", ".join(f"{op} ×{n}" for op, n in sorted(missing.items()))
    return (
        f"{provider} has no kernel in onnxruntime {version} for {nodes} at these types: ONNX Runtime would run "
        "them on the CPU, so it is not offered for this graph"
    )


@functools.lru_cache(maxsize=64)
def _missing(path: str, size: int, mtime_ns: int, provider: str) -> tuple[tuple[str, int], ...]:
    kernels = _kernels()
    if kernels is None:
        return ()
    model = _typed_graph(onnx.load(path))
    opsets = {("" if d.domain in ONNX_DOMAINS else d.domain): d.version for d in model.opset_import}
    types = _value_types(model.graph)
    functions = {(f.domain, f.name) for f in model.functions}  # inlined at load: their bodies run instead
    missing: Counter[str] = Counter()
    for node in model.graph.node:
        domain = "" if node.domain in ONNX_DOMAINS else node.domain
        if node.op_type in RESOLVED_AT_LOAD or (node.domain, node.op_type) in functions:
            continue
        if not _on_data(node, types):
            continue
        if not _has_kernel(kernels, provider, domain, node, opsets.get(domain), types):
            missing[node.op_type] += 1
    return tuple(sorted(missing.items()))


@functools.cache
def _kernels() -> dict[tuple[str, str, str], list[Any]] | None:
    """(provider, domain, op) -> the registered kernel definitions; None where the build does not list them."""
    try:
        from onnxruntime.capi import _pybind_state as ort_c

        definitions = ort_c.get_all_opkernel_def()
    except (ImportError, AttributeError, RuntimeError):
        return None
    table: dict[tuple[str, str, str], list[Any]] = {}
    for kernel in definitions:
        table.setdefault((kernel.provider, kernel.domain, kernel.op_name), []).append(kernel)
    return table


@functools.cache
def _schemas() -> dict[tuple[str, str], list[Any]]:
    """(domain, op) -> ONNX Runtime's operator schemas (ONNX and contrib), oldest first."""
    from onnxruntime.capi import _pybind_state as ort_c

    table: dict[tuple[str, str], list[Any]] = {}
    for schema in ort_c.get_all_operator_schema():
        domain = "" if schema.domain in ONNX_DOMAINS else schema.domain
        table.setdefault((domain, schema.name), []).append(schema)
    for versions in table.values():
        versions.sort(key=lambda s: s.since_version)
    return table


def _has_kernel(
    kernels: dict[tuple[str, str, str], list[Any]],
    provider: str,
    domain: str,
    node: onnx.NodeProto,
    opset: int | None,
    types: dict[str, str],
) -> bool:
    schema = _schema_at(domain, node.op_type, opset)
    if schema is None:  # an op ONNX Runtime does not know: no provider runs it
        return False
    for kernel in kernels.get((provider, domain, node.op_type), []):
        first, last = kernel.version_range
        if first <= schema.since_version <= last and _types_fit(kernel, schema, node, types):
            return True
    return False


def _on_data(node: onnx.NodeProto, types: dict[str, str]) -> bool:
    """The node reads or writes a tensor of known type that is not integer shape arithmetic."""
    known = [types[name] for name in [*node.input, *node.output] if name in types]
    return any(t not in SHAPE_TYPES for t in known)


def _schema_at(domain: str, op: str, opset: int | None) -> Any:
    """The schema a node of this opset uses: the newest one not newer than the opset."""
    versions = [s for s in _schemas().get((domain, op), []) if opset is None or s.since_version <= opset]
    return versions[-1] if versions else None


def _types_fit(kernel: Any, schema: Any, node: onnx.NodeProto, types: dict[str, str]) -> bool:
    """Every known input and output type is one the kernel takes for its type parameter."""
    for names, formals in ((node.input, schema.inputs), (node.output, schema.outputs)):
        for i, name in enumerate(names):
            if not name or not formals:
                continue
            formal = formals[min(i, len(formals) - 1)]  # variadic: the last formal covers the rest
            allowed = kernel.type_constraints.get(formal.typeStr)
            known = types.get(name)
            if allowed and known and known not in allowed:
                return False
    return True


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
    except Exception:  # noqa: BLE001 - types help matching; without them ops and versions still decide
        return light


def _value_types(graph: onnx.GraphProto) -> dict[str, str]:
    """Value name -> 'tensor(<elem>)' as ONNX Runtime's kernel constraints spell it."""
    types: dict[str, str] = {}
    for value in [*graph.input, *graph.output, *graph.value_info]:
        elem = value.type.tensor_type.elem_type
        if value.type.HasField("tensor_type") and elem:
            types[value.name] = f"tensor({onnx.TensorProto.DataType.Name(elem).lower()})"
    return types
