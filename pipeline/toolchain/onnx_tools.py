"""Shared ONNX helpers for the precision stages: loading and saving self-contained files, mapping graph nodes
back to the PyTorch modules they came from, choosing which nodes to quantize, and counting what a graph holds.

Module paths matter because the dynamo exporter renames nodes and initializers (`node_MatMul_51`, `val_52`):
a recipe says `*.output.dense`, and only the exporter's `pkg.torch.onnx.name_scopes` metadata ties that name to
a node. The legacy exporter encodes the same path in node names (`/encoder/layer.0/output/dense/MatMul`)."""

from __future__ import annotations

import ast
import contextlib
import fnmatch
import heapq
import re
import tempfile
from collections import Counter
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import onnx

from pipeline.core.errors import StageError
from pipeline.core.packages import package_version
from pipeline.core.test_hooks import kill_point

NAME_SCOPES_KEY = "pkg.torch.onnx.name_scopes"
_NO_MODULE_STACK = "_empty_nn_module_stack"
ACTIVATION_MATMUL = "activation MatMul (weights_only_matmul)"
PROTOBUF_LIMIT = 2**31 - 1
FLOAT_TYPES = {
    onnx.TensorProto.FLOAT,
    onnx.TensorProto.FLOAT16,
    onnx.TensorProto.DOUBLE,
    onnx.TensorProto.BFLOAT16,
}
# Nodes that move or reinterpret data rather than compute on it; excluded from the fp16 share.
_WEIGHT_OPS = {"Conv", "ConvTranspose", "Gemm", "MatMul"}
_MODULE_PATH = re.compile(r"\w+(\.\w+)*")
_NON_COMPUTE = {"Cast", "Constant", "Identity", "Shape", "Size", "QuantizeLinear", "DequantizeLinear"}


# ------------------------------------------------------------------ files


def load(path: Path | str) -> onnx.ModelProto:
    """Load a model with its weights (external data, if the file has any, is pulled in)."""
    return onnx.load(str(path), load_external_data=True)


def save(model: onnx.ModelProto, path: Path | str) -> None:
    """Write one self-contained file (the contract: no external data below 2 GB); protobuf's serializer is
    deterministic for equal messages, so equal models give equal bytes."""
    data = model.SerializeToString(deterministic=True)
    if len(data) > PROTOBUF_LIMIT:
        raise StageError(
            f"{Path(path).name}: {len(data)} bytes exceeds the 2 GB limit of a self-contained ONNX file"
        )
    Path(path).write_bytes(data)


def fp16_block_list(block_ops: list[str]) -> list[str]:
    """Op types an FP16 conversion keeps in FP32: ONNX Runtime converter's own list (ops with no FP16 kernels
    anywhere) plus the recipe's overflow-prone ops."""
    from onnxruntime.transformers.float16 import DEFAULT_OP_BLOCK_LIST

    return sorted(set(DEFAULT_OP_BLOCK_LIST) | set(block_ops))


REDUCING_SCATTERS = ("ScatterElements", "ScatterND")  # with a `reduction` attribute (opset 16+)


def reducing_scatter_nodes(graph: onnx.GraphProto) -> list[onnx.NodeProto]:
    """The ScatterElements and ScatterND nodes that accumulate (reduction add, mul, min or max): ONNX Runtime's
    CPU kernels have no float16 version of them ("MLFloat16 data type is not supported with ScatterElements
    opset 16 when reduction is 'add'"), so an FP16 graph keeps them in float32; the main graph only (the
    converter's node list is by name, and the graph's own nodes are what it converts)."""
    found = []
    for node in graph.node:
        if node.op_type not in REDUCING_SCATTERS or node.domain not in ("", "ai.onnx"):
            continue
        reduction = next((a.s.decode() for a in node.attribute if a.name == "reduction"), "none")
        if reduction != "none":
            found.append(node)
    return found


def fp16_node_block_list(graph: onnx.GraphProto) -> list[str]:
    """The names of the nodes an FP16 conversion keeps in FP32 (`reducing_scatter_nodes`), naming those that
    had none: both FP16 conversions (the plain copy and the optimized graph's) pass it as `node_block_list`."""
    kept = reducing_scatter_nodes(graph)
    for i, node in enumerate(kept):
        node.name = node.name or f"fp16_kept_scatter_{i}"
    return [node.name for node in kept]


def onnx_environment(*extra: str) -> dict[str, str | None]:
    """Library versions an ONNX stage depends on; onnxruntime may come from either wheel."""
    env = {
        "onnx": package_version("onnx"),
        "onnxruntime": package_version("onnxruntime") or package_version("onnxruntime-gpu"),
    }
    env.update({name: package_version(name) for name in extra})
    return env


def graph_inputs(model: onnx.ModelProto) -> list[str]:
    """Inputs a session must be fed (old-style graphs also list initializers as inputs)."""
    inits = {i.name for i in model.graph.initializer}
    return [i.name for i in model.graph.input if i.name not in inits]


def op_counts(model: onnx.ModelProto) -> dict[str, int]:
    """Node count per op type (domain-qualified when not the default domain), sorted by name."""
    counts = Counter(
        f"{n.domain}.{n.op_type}" if n.domain not in ("", "ai.onnx") else n.op_type for n in model.graph.node
    )
    return dict(sorted(counts.items()))


@contextlib.contextmanager
def scratch_cwd() -> Iterator[None]:
    """ONNX Runtime's symbolic shape inference saves `sym_shape_infer_temp.onnx` plus a model-sized `.data`
    file into the current directory when it cannot finish (it does not on dynamo MiniLM graphs): run such
    tools from a throw-away directory so nothing lands in the user's working directory. Pass absolute paths."""
    with tempfile.TemporaryDirectory(prefix="onnx-scratch-") as tmp, contextlib.chdir(tmp):
        kill_point("scratch")
        yield


# ------------------------------------------------------------------ node -> module path


def module_path(node: onnx.NodeProto) -> str | None:
    """The PyTorch module a node was exported from ('encoder.layer.0.output.dense'), '' for the top level,
    None when neither the dynamo metadata nor a legacy-style node name tells."""
    for prop in node.metadata_props:
        if prop.key == NAME_SCOPES_KEY:
            scopes = _parse_scopes(prop.value)
            if scopes is not None:
                # The last scope is the FX node itself (e.g. 'linear_3'); the one before it is its module.
                # Nodes with no module stack (symbolic sizes) carry a placeholder scope: top level.
                module = scopes[-2] if len(scopes) >= 2 else ""
                return "" if module.startswith(_NO_MODULE_STACK) else module
    if node.name.startswith("/") and node.name.count("/") >= 2:
        return ".".join(node.name.strip("/").split("/")[:-1])
    return None


def _parse_scopes(value: str) -> list[str] | None:
    try:
        scopes = ast.literal_eval(value)
    except (ValueError, SyntaxError):
        return None
    if isinstance(scopes, list | tuple) and all(isinstance(s, str) for s in scopes):
        return list(scopes)
    return None


def owner_path(node: onnx.NodeProto, initializers: set[str]) -> str | None:
    """The module that owns a weighted op: the one whose parameter it reads (`features.0.weight` ->
    `features.0`), else its name scope. A Conv with a BatchNorm folded into it carries the BatchNorm's scope
    (`features.1`) but still reads the Conv's weight, and the recipe's patterns name the Conv."""
    if node.op_type in _WEIGHT_OPS and len(node.input) > 1 and node.input[1] in initializers:
        owner, dot, leaf = node.input[1].rpartition(".")
        if dot and leaf == "weight" and _MODULE_PATH.fullmatch(owner):
            return owner
    return module_path(node)


def module_paths(model: onnx.ModelProto) -> dict[str, str | None]:
    """Node name -> the path of the module that owns it, for every node of the main graph."""
    initializers = {i.name for i in model.graph.initializer}
    return {n.name: owner_path(n, initializers) for n in model.graph.node}


def matches(path: str | None, patterns: Iterable[str]) -> bool:
    """fnmatch on the module path ('*' also crosses dots); a node with no known path matches nothing."""
    return path is not None and any(fnmatch.fnmatchcase(path, p) for p in patterns)


# ------------------------------------------------------------------ feed-forward layers

# Ops a feed-forward block's value passes through between its two linears: elementwise math, activations, and
# reshapes that keep each element where it is (GPT-2's Conv1D is a Gemm between two Reshapes). Anything else
# (Transpose, Softmax, a normalization, a reduction) ends the walk: attention and residual paths stop there.
FEED_FORWARD_PATH = frozenset(
    {
        "Add", "Sub", "Mul", "Div", "Pow", "Sqrt", "Neg", "Exp", "Cast", "Identity", "Dropout",
        "Reshape", "Flatten", "Squeeze", "Unsqueeze",
    }
)  # fmt: skip
ACTIVATIONS = frozenset(
    {
        "Relu", "LeakyRelu", "PRelu", "Elu", "Selu", "Celu", "Gelu", "FastGelu", "BiasGelu", "QuickGelu",
        "Erf", "Tanh", "Sigmoid", "HardSigmoid", "HardSwish", "Softplus", "Mish", "Clip",
    }
)  # fmt: skip
FEED_FORWARD = "feed-forward layer (exclude_feed_forward)"
_WALK_LIMIT = 64  # nodes visited from one linear: a block's activation is a handful of ops away


def weight_ops(
    model: onnx.ModelProto, op_types: tuple[str, ...] = ("MatMul", "Gemm")
) -> list[onnx.NodeProto]:
    """Nodes of these types whose second input is a constant: the model's linear layers by default, its weight
    layers of every kind with Conv and ConvTranspose added."""
    constants = {i.name for i in model.graph.initializer} | {
        o for n in model.graph.node if n.op_type == "Constant" for o in n.output
    }
    return [
        n for n in model.graph.node if n.op_type in op_types and len(n.input) > 1 and n.input[1] in constants
    ]


def feed_forward_nodes(model: onnx.ModelProto) -> list[str]:
    """The linears of every feed-forward block, found from the graph rather than from module names: a linear
    whose output reaches another linear through elementwise ops and reshapes only, with an activation on
    the way (BERT's intermediate/output, DistilBERT's lin1/lin2, GPT-2's c_fc/c_proj, T5's wi/wo, gated
    wi_0/wi_1 included, ViT's and Whisper's fc1/fc2). Both linears of each pair, in graph order."""
    linears = weight_ops(model)
    is_linear = {id(n) for n in linears}
    consumers: dict[str, list[onnx.NodeProto]] = {}
    for node in model.graph.node:
        for name in node.input:
            consumers.setdefault(name, []).append(node)
    reaches: dict[str, list[tuple[str, bool]]] = {}  # up-projection -> (down-projection, activation seen)
    for linear in linears:
        found: list[tuple[str, bool]] = []
        stack = [(out, False) for out in linear.output]
        seen: set[tuple[str, bool]] = set()
        while stack and len(seen) < _WALK_LIMIT:
            value, activated = stack.pop()
            for node in consumers.get(value, []):
                if id(node) in is_linear:
                    found.append((node.name, activated))
                elif node.op_type in FEED_FORWARD_PATH or node.op_type in ACTIVATIONS:
                    step = (node.name, activated or node.op_type in ACTIVATIONS)
                    if step not in seen:
                        seen.add(step)
                        stack += [(out, step[1]) for out in node.output]
        reaches[linear.name] = found
    down = {name for found in reaches.values() for name, activated in found if activated}
    up = {a for a, found in reaches.items() if any(name in down for name, _ in found)}
    return [n.name for n in linears if n.name in up or n.name in down]


@dataclass
class Selection:
    """Which nodes of the quantizable op types to quantize, and which the recipe's rules left out and why."""

    quantize: list[str] = field(default_factory=list)
    excluded: dict[str, str] = field(default_factory=dict)  # node name -> reason
    paths: dict[str, str | None] = field(default_factory=dict)

    def label(self, node_name: str) -> str:
        return self.paths.get(node_name) or node_name

    def by_pattern(self) -> list[str]:
        """Labels of the nodes the recipe's rules left out (patterns and feed-forward layers; activation
        MatMuls aside), each once: a module run several times (ALBERT shares one layer's weights across its
        layers) is one node per run under one label."""
        return sorted({self.label(n) for n, why in self.excluded.items() if why != ACTIVATION_MATMUL})

    def feed_forward(self) -> list[str]:
        """Labels of the feed-forward linears kept in float (exclude_feed_forward), each once, in graph order."""
        return list(dict.fromkeys(self.label(n) for n, why in self.excluded.items() if why == FEED_FORWARD))

    def activation_matmuls(self) -> int:
        return sum(why == ACTIVATION_MATMUL for why in self.excluded.values())


def select_nodes(
    model: onnx.ModelProto,
    op_types: Iterable[str],
    weights_only_matmul: bool,
    include: Iterable[str] = (),
    exclude: Iterable[str] = (),
    exclude_feed_forward: bool = False,
) -> Selection:
    """Nodes to quantize: op type listed; for MatMul (when weights_only_matmul) a constant second input;
    not a feed-forward linear (when exclude_feed_forward); module path matching `include` (when given) and
    not matching `exclude`."""
    op_types, include, exclude = set(op_types), list(include), list(exclude)
    constants = {i.name for i in model.graph.initializer} | {
        o for n in model.graph.node if n.op_type == "Constant" for o in n.output
    }
    feed_forward = set(feed_forward_nodes(model)) if exclude_feed_forward else set()
    selection = Selection(paths=module_paths(model))
    for node in model.graph.node:
        if node.op_type not in op_types:
            continue
        path = selection.paths[node.name]
        if weights_only_matmul and node.op_type == "MatMul" and node.input[1] not in constants:
            selection.excluded[node.name] = ACTIVATION_MATMUL
        elif node.name in feed_forward:
            selection.excluded[node.name] = FEED_FORWARD
        elif include and not matches(path, include):
            selection.excluded[node.name] = "not matched by include"
        elif matches(path, exclude):
            selection.excluded[node.name] = "matched by exclude"
        else:
            selection.quantize.append(node.name)
    return selection


def outputs_from_nodes(model: onnx.ModelProto) -> None:
    """Give every constant graph output a producing node: an output that is an initializer (a batch-independent
    constant the exporter folded, such as a learned temperature) gets an Identity in front.
    The FP16 converters wrap each output in a Cast and then find that Cast fed by nothing they sorted (ONNX
    Runtime's converter: "nodes must be topologically sorted")."""
    graph = model.graph
    sources = {i.name for i in graph.initializer} - {i.name for i in graph.input}  # an input stays an input
    for output in graph.output:
        if output.name not in sources:
            continue
        held = f"{output.name}__value"
        for initializer in graph.initializer:
            if initializer.name == output.name:
                initializer.name = held
        for node in graph.node:
            node.input[:] = [held if name == output.name else name for name in node.input]
        graph.node.append(onnx.helper.make_node("Identity", [held], [output.name], name=f"{held}_identity"))


def drop_initializer_value_info(model: onnx.ModelProto) -> None:
    """Remove value_info entries that restate an initializer's type (the dynamo exporter writes them): the
    FP16 converter retypes every float value_info, also those of initializers it keeps FP32 for blocked ops,
    and the graph then contradicts itself."""
    inits = {i.name for i in model.graph.initializer}
    kept = [v for v in model.graph.value_info if v.name not in inits]
    del model.graph.value_info[:]
    model.graph.value_info.extend(kept)


# ------------------------------------------------------------------ precision statistics


def value_types(model: onnx.ModelProto) -> dict[str, int] | None:
    """Element type of every value (inputs, outputs, initializers, inferred intermediates); None when ONNX
    shape inference cannot type every value (contrib ops such as com.microsoft.SkipLayerNormalization)."""
    try:
        inferred = onnx.shape_inference.infer_shapes(model, strict_mode=True)
    except onnx.shape_inference.InferenceError:
        return None
    types = {i.name: i.data_type for i in inferred.graph.initializer}
    for value in [*inferred.graph.input, *inferred.graph.output, *inferred.graph.value_info]:
        if value.type.HasField("tensor_type"):
            types[value.name] = value.type.tensor_type.elem_type
    for node in inferred.graph.node:
        if node.op_type == "Constant":
            for attr in node.attribute:
                if attr.name == "value":
                    types[node.output[0]] = attr.t.data_type
    if any(o and o not in types for n in inferred.graph.node for o in n.output):
        return None  # ops ONNX has no schema for (contrib domains) leave their outputs untyped
    return types


def fp16_node_share(model: onnx.ModelProto) -> float | None:
    """Share of compute nodes (those with a floating-point output, casts and constants aside) whose float
    outputs are all float16: how much of the graph really runs in half precision. None when the graph's
    types cannot be inferred."""
    types = value_types(model)
    if types is None:
        return None
    compute = fp16 = 0
    for node in model.graph.node:
        if node.op_type in _NON_COMPUTE:
            continue
        outs = [types[o] for o in node.output if o and types.get(o) in FLOAT_TYPES]
        if not outs:
            continue
        compute += 1
        fp16 += all(t == onnx.TensorProto.FLOAT16 for t in outs)
    return round(fp16 / compute, 4) if compute else 0.0


def initializer_dtypes(model: onnx.ModelProto) -> dict[str, int]:
    """Count of initializers per element type name ('FLOAT16': 120): a quick look at where weights live."""
    counts = Counter(onnx.TensorProto.DataType.Name(i.data_type) for i in model.graph.initializer)
    return dict(sorted(counts.items()))


def ensure_opset_imports(model: onnx.ModelProto) -> None:
    """Declare every node domain the graph uses (optimizers add com.microsoft ops without importing it)."""
    declared = {o.domain for o in model.opset_import}
    for domain in sorted({n.domain for n in model.graph.node} - declared - {"ai.onnx"}):
        model.opset_import.append(onnx.helper.make_opsetid(domain, 1))


def has_external_data(model: onnx.ModelProto) -> bool:
    return any(i.data_location == onnx.TensorProto.EXTERNAL for i in model.graph.initializer)


def topological_sort(graph: onnx.GraphProto) -> None:
    """Reorder nodes so that every input is produced before use (converters append Cast nodes at the end);
    stable: among ready nodes the original order wins, so equal graphs give equal bytes."""
    produced = {i.name for i in graph.input} | {i.name for i in graph.initializer} | {""}
    producer = {o: idx for idx, n in enumerate(graph.node) for o in n.output}
    pending = list(graph.node)
    waiting_on: dict[str, list[int]] = {}
    missing = []
    for idx, node in enumerate(pending):
        needs = {i for i in node_inputs(node) if i not in produced and i in producer}
        missing.append(len(needs))
        for name in needs:
            waiting_on.setdefault(name, []).append(idx)
    ready = [idx for idx, m in enumerate(missing) if m == 0]
    heapq.heapify(ready)
    order = []
    while ready:
        idx = heapq.heappop(ready)
        order.append(idx)
        for out in pending[idx].output:
            for waiter in waiting_on.pop(out, []):
                missing[waiter] -= 1
                if missing[waiter] == 0:
                    heapq.heappush(ready, waiter)
    if len(order) != len(pending):
        raise StageError("the graph has a cycle: cannot sort it topologically")
    nodes = [pending[i] for i in order]
    del graph.node[:]
    graph.node.extend(nodes)


def rehome_subgraph_nodes(graph: onnx.GraphProto) -> int:
    """Move main-graph nodes that read a name only a Loop/If/Scan body defines into that body, then sort every
    body; returns how many moved. ONNX Runtime's float16 converter appends the Casts around a blocked node to
    the main graph even where the node lives in a body (an EmbeddingBag's Loop), which no checker or runtime
    accepts: there the Cast can only sit beside the node it feeds."""
    moved = 0
    while True:  # a Cast reading another misplaced Cast finds its home once that one has moved
        defined = {i.name for i in graph.input} | {i.name for i in graph.initializer} | {""}
        defined |= {o for n in graph.node for o in n.output}
        homes = [
            (node, _defining_body(graph, missing[0]))
            for node in list(graph.node)
            if (missing := [i for i in node.input if i not in defined])
        ]
        homes = [(node, home) for node, home in homes if home is not None]
        if not homes:
            break
        for node, home in homes:
            graph.node.remove(node)
            home.node.append(node)
        moved += len(homes)
    if moved:  # innermost first: sorting a body rebuilds its nodes, and with them the bodies inside
        for body in reversed(subgraphs(graph)):
            topological_sort(body)
    return moved


def subgraphs(graph: onnx.GraphProto) -> list[onnx.GraphProto]:
    """Every subgraph (Loop, If and Scan bodies) of `graph`'s nodes, at any depth, outermost first."""
    found = []
    for node in graph.node:
        for attr in node.attribute:
            for sub in [attr.g] if attr.HasField("g") else list(attr.graphs):
                found += [sub, *subgraphs(sub)]
    return found


def _defining_body(graph: onnx.GraphProto, name: str) -> onnx.GraphProto | None:
    """The subgraph (at any depth) whose own nodes, inputs or initializers define `name`."""
    for body in subgraphs(graph):
        defined = {i.name for i in body.input} | {i.name for i in body.initializer}
        if name in defined | {o for n in body.node for o in n.output}:
            return body
    return None


def node_inputs(node: onnx.NodeProto) -> set[str]:
    """Inputs of a node including names its subgraphs (If/Loop bodies) capture from the outer scope."""
    names = set(node.input)
    for attr in node.attribute:
        for sub in [attr.g] if attr.HasField("g") else list(attr.graphs):
            inner = (
                {o for n in sub.node for o in n.output}
                | {i.name for i in sub.input}
                | {i.name for i in sub.initializer}
            )
            for n in sub.node:
                names |= {i for i in node_inputs(n) if i not in inner}
    return names
