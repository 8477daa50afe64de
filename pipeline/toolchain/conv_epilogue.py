"""Each convolution with its batch norm, residual add and ReLU as one cuDNN call, on an exported graph.

On a GPU Inductor runs a CNN's convolutions in cuDNN and what follows each one (the batch norm, the residual
add, the ReLU) in a Triton kernel after it, so every activation is written by the convolution and read back by
that kernel. cuDNN's runtime-fusion engines run them inside the convolution's own kernel
(`aten.cudnn_convolution_relu`, `aten.cudnn_convolution_add_relu`): on an H100, torchvision ResNet-50 in FP16,
channels-last, ran 9 to 11% faster that way than compiled by torch.compile, both in a CUDA graph
(scripts/gpu_cnn_fused_peers.py, docs/gpu.md). The pass folds each inference batch norm into the convolution
before it, then rewrites conv + ReLU and conv + add + ReLU. Model-agnostic: any `aten.conv2d` with a constant
weight and integer geometry whose output is channels-last. The ops are CUDA-only: the stages apply the pass to
programs compiled for a GPU. torch gives them no meta kernel, which torch.export and Inductor need to trace
them: `register_meta` adds one, whose output has the layout cuDNN picks (channels-last when the input or the
weight is).
The caller re-exports the result.
"""

from __future__ import annotations

import operator
from typing import Any

import torch
from torch import fx
from torch._prims_common import suggest_memory_format

CONV = torch.ops.aten.conv2d.default
BATCH_NORM = torch.ops.aten.batch_norm.default
RELU = (torch.ops.aten.relu.default, torch.ops.aten.relu_.default)
ADD = (torch.ops.aten.add.Tensor, torch.ops.aten.add_.Tensor)
CONV_RELU = torch.ops.aten.cudnn_convolution_relu.default
CONV_ADD_RELU = torch.ops.aten.cudnn_convolution_add_relu.default
_LIBRARIES: list[torch.library.Library] = []  # kept alive: a registration lasts as long as its library


def _cudnn_layout(x: torch.Tensor, weight: torch.Tensor) -> torch.memory_format:
    """The layout cuDNN writes its output in (ATen's cudnn_conv_suggest_memory_format)."""
    if torch.channels_last in (suggest_memory_format(x), suggest_memory_format(weight)):
        return torch.channels_last
    return torch.contiguous_format


def _conv_relu_meta(
    x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, *geometry: Any
) -> torch.Tensor:
    out = torch.nn.functional.conv2d(x, weight, bias, *geometry)
    return out.contiguous(memory_format=_cudnn_layout(x, weight))


def _conv_add_relu_meta(
    x: torch.Tensor,
    weight: torch.Tensor,
    z: torch.Tensor,
    alpha: Any,
    bias: torch.Tensor | None,
    *geometry: Any,
) -> torch.Tensor:
    return _conv_relu_meta(x, weight, bias, *geometry)


def register_meta() -> None:
    """Meta kernels for the two fused ops, once per process, unless torch has its own."""
    if _LIBRARIES:
        return
    library = torch.library.Library("aten", "IMPL")
    for name, kernel in (
        ("cudnn_convolution_relu", _conv_relu_meta),
        ("cudnn_convolution_add_relu", _conv_add_relu_meta),
    ):
        if not torch._C._dispatch_has_kernel_for_dispatch_key(f"aten::{name}", "Meta"):
            library.impl(name, kernel, "Meta")
    _LIBRARIES.append(library)


def _constant(module: fx.GraphModule, node: object) -> torch.Tensor | None:
    if isinstance(node, fx.Node) and node.op == "get_attr":
        value = operator.attrgetter(node.target)(module)
        return value if isinstance(value, torch.Tensor) else None
    return None


def _geometry(conv: fx.Node) -> tuple[list[int], list[int], list[int], int] | None:
    """stride, padding, dilation and groups of an aten.conv2d call, with its defaults; None where any is not a
    plain integer (a symbolic size, or padding given as "same")."""
    named = conv.normalized_arguments(conv.graph.owning_module, normalize_to_only_use_kwargs=True)
    if named is None:
        return None
    stride, padding, dilation, groups = (named.kwargs[k] for k in ("stride", "padding", "dilation", "groups"))
    pairs = [list(v) if isinstance(v, list | tuple) else [v] for v in (stride, padding, dilation)]
    pairs = [p * 2 if len(p) == 1 else p for p in pairs]  # the schema's [1] stands for [1, 1]
    if not all(len(p) == 2 and all(type(i) is int for i in p) for p in pairs) or type(groups) is not int:
        return None
    return pairs[0], pairs[1], pairs[2], groups


def _val(node: object) -> torch.Tensor | None:
    value = node.meta.get("val") if isinstance(node, fx.Node) else None
    return value if isinstance(value, torch.Tensor) else None


def fold_batch_norms(module: fx.GraphModule) -> int:
    """Each inference batch norm whose input is a convolution read by it alone, folded into that convolution's
    weight and bias (computed in FP32, stored in the weight's dtype and layout); returns how many."""
    graph, folded = module.graph, 0
    for norm in list(graph.nodes):
        if norm.op != "call_function" or norm.target != BATCH_NORM or len(norm.args) < 8 or norm.args[5]:
            continue
        conv = norm.args[0]
        if not isinstance(conv, fx.Node) or conv.target != CONV or len(conv.users) != 1 or conv.kwargs:
            continue
        given = [conv.args[2] if len(conv.args) > 2 else None, *norm.args[1:3]]  # bias, gamma, beta
        weight, mean, var = (_constant(module, a) for a in (conv.args[1], *norm.args[3:5]))
        bias, gamma, beta = (_constant(module, a) if a is not None else None for a in given)
        if any(a is not None and c is None for a, c in zip(given, (bias, gamma, beta), strict=True)):
            continue  # one of them computed in the graph: the fold would drop it
        if weight is None or weight.dim() != 4 or mean is None or var is None:
            continue
        scale = torch.rsqrt(var.float() + float(norm.args[7]))
        if gamma is not None:
            scale = scale * gamma.float()
        shift = (bias.float() if bias is not None else 0) - mean.float()
        new_bias = shift * scale + (beta.float() if beta is not None else 0)
        new_weight = torch.empty_like(weight).copy_(weight.float() * scale.reshape(-1, 1, 1, 1))
        if not (new_weight.isfinite().all() and new_bias.to(weight.dtype).isfinite().all()):
            continue  # past the weight dtype's range (a near-zero variance in FP16): left unfolded
        names = [f"_folded_{folded}_{part}" for part in ("weight", "bias")]
        module.register_buffer(names[0], new_weight.detach())
        module.register_buffer(names[1], new_bias.to(weight.dtype).detach())
        with graph.inserting_before(conv):
            weight_node, bias_node = graph.get_attr(names[0]), graph.get_attr(names[1])
        conv.args = (conv.args[0], weight_node, bias_node, *conv.args[3:])
        norm.replace_all_uses_with(conv)
        graph.erase_node(norm)
        folded += 1
    return folded


def _fusable(module: fx.GraphModule, conv: object, reader: fx.Node) -> bool:
    """A 2-D convolution read by `reader` alone, of a constant weight and plain geometry, writing channels-last;
    not grouped, since cuDNN's fusion engines were measured on dense convolutions only and a shape no engine
    takes fails when it runs, not when it is built."""
    if not isinstance(conv, fx.Node) or conv.target != CONV or set(conv.users) != {reader}:
        return False
    weight, out, geometry = _constant(module, conv.args[1]), _val(conv), _geometry(conv)
    if weight is None or weight.dim() != 4 or out is None or geometry is None or geometry[3] != 1:
        return False
    if weight.shape[1:] == (1, 1, 1):  # no strides say channels-last: cuDNN's layout would follow the input's
        return False
    return suggest_memory_format(out) == torch.channels_last


def _channels_last_weight(module: fx.GraphModule, conv: fx.Node, index: int) -> None:
    """The convolution's weight in channels-last strides (a copy of its own where it is not), the layout
    cuDNN's channels-last kernels read; the output's layout follows the input's and the weight's alike in the
    op and in its meta kernel (_cudnn_layout)."""
    weight = operator.attrgetter(conv.args[1].target)(module)
    if suggest_memory_format(weight) == torch.channels_last:
        return
    name = f"_channels_last_{index}_weight"
    module.register_buffer(name, weight.detach().contiguous(memory_format=torch.channels_last))
    with module.graph.inserting_before(conv):
        conv.args = (conv.args[0], module.graph.get_attr(name), *conv.args[2:])


def _bias(conv: fx.Node) -> object:
    return conv.kwargs.get("bias", conv.args[2] if len(conv.args) > 2 else None)


def fuse_conv_epilogues(module: fx.GraphModule) -> int:
    """Rewrite `module` in place (batch norms folded first); returns how many convolutions became one cuDNN
    call with their ReLU (and residual add)."""
    register_meta()
    graph = module.graph
    folded = fold_batch_norms(module)
    fused = 0
    for relu in list(graph.nodes):
        if relu.op != "call_function" or relu.target not in RELU or len(relu.args) != 1:
            continue
        source = relu.args[0]
        if _fusable(module, source, relu):
            conv, z = source, None
        elif (found := _residual(module, source, relu)) is not None:
            conv, z = found
        else:
            continue
        if _mutated_between(conv, relu, {source, relu}):
            continue
        _channels_last_weight(module, conv, fused)
        x, weight, bias, geometry = conv.args[0], conv.args[1], _bias(conv), _geometry(conv)
        if z is None:
            call, args = CONV_RELU, (x, weight, bias, *geometry)
        else:
            call, args = CONV_ADD_RELU, (x, weight, z, 1.0, bias, *geometry)
        with graph.inserting_before(relu):
            replacement = graph.call_function(call, args)
        replacement.meta = dict(relu.meta)
        relu.replace_all_uses_with(replacement)
        graph.erase_node(relu)
        if source is not conv:
            graph.erase_node(source)
        graph.erase_node(conv)
        fused += 1
    if fused or folded:
        _drop_unused_constants(module)
        graph.lint()
        module.recompile()
    return fused


def _mutated_between(conv: fx.Node, relu: fx.Node, matched: set[fx.Node]) -> bool:
    """Whether an in-place op other than the matched add and ReLU runs between the convolution and its ReLU:
    the fused call reads the convolution's input and the residual where the ReLU was, so a tensor written in
    between would be read changed."""
    node = conv.next
    while node is not relu and node.op != "root":
        schema = getattr(node.target, "_schema", None)
        calls = (
            node.op in ("call_function", "call_method", "call_module") and node.target is not operator.getitem
        )
        writes = schema.is_mutable if schema is not None else calls  # no schema: nothing says it does not
        if node not in matched and writes:
            return True
        node = node.next
    return False


def _drop_unused_constants(module: fx.GraphModule) -> None:
    """The weights and batch-norm statistics the folding replaced, out of the graph and the module, so the
    re-exported program does not carry them."""
    graph = module.graph
    unused = [n for n in graph.nodes if n.op == "get_attr" and not n.users]
    for node in unused:
        graph.erase_node(node)
    still = {n.target for n in graph.nodes if n.op == "get_attr"}
    for target in {n.target for n in unused} - still:
        owner, _, name = target.rpartition(".")
        holder = operator.attrgetter(owner)(module) if owner else module
        if hasattr(holder, name):
            delattr(holder, name)


def _residual(module: fx.GraphModule, add: object, relu: fx.Node) -> tuple[fx.Node, fx.Node] | None:
    """(convolution, residual) where `add` sums a fusable convolution and a tensor of its output's shape and
    dtype, read by the ReLU alone; an in-place add must write into the convolution's output, which nothing
    else reads."""
    if (
        not isinstance(add, fx.Node)
        or add.target not in ADD
        or set(add.users) != {relu}
        or len(add.args) != 2
    ):
        return None
    if add.kwargs.get("alpha", 1) != 1:
        return None
    in_place = add.target == torch.ops.aten.add_.Tensor
    for i, (conv, z) in enumerate([add.args, add.args[::-1]]):
        if in_place and i == 1:
            break
        if not isinstance(z, fx.Node) or z is conv or not _fusable(module, conv, add):
            continue
        out, other = _val(conv), _val(z)
        # compared as text: symbolic sizes alike print alike, and no guard is asked of a spent shape env
        if (
            other is not None
            and out is not None
            and str((other.shape, other.dtype)) == str((out.shape, out.dtype))
        ):
            return conv, z
    return None
