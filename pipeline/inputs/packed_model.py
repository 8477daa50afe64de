"""The model as a packed graph: projections and feed-forward layers on the real tokens only, attention per
sentence. The layout of its inputs is pipeline/core/packing.py's.

A transformers model reaches attention through one pluggable function (`attn_implementation`), so packing
needs no change to the user's model. Two attentions: for ONNX graphs, which have no variable-length attention,
`packed_attention` gathers each sentence's queries, keys and values into a `[batch, heads, longest, dim]` grid,
masks the grid's padding, and scatters the result back to the tokens; for PyTorch programs, `varlen_attention`
reads each sentence's span of the row (FlashAttention's variable-length kernel on a GPU that has it).
Positions come in as an input (a packed row would otherwise number its tokens 0..tokens-1). Everything else a
transformer layer does works token by token, so the packed model computes what the padded one does on every
real token. A model that mixes tokens some other way (a convolution over the sequence, a pooler that reads
position 0 of the row) does not; `check_exact` runs both and says by how much, before anything is exported.
"""

from __future__ import annotations

import contextlib
import inspect
from collections.abc import Iterator
from typing import Any

import torch
from torch import nn

from pipeline.core.packing import Packing, grid_names
from pipeline.inputs.models import Bound, SentenceEncoder, mean_pool, pick_outputs

ATTENTION = "pipeline_packed"  # the names the packed attentions are registered under in transformers
VARLEN = "pipeline_varlen"


def packed_attention(
    module: nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    scaling: float | None = None,
    dropout: float = 0.0,
    pack_grids: tuple[torch.Tensor, ...] = (),
    pack_biases: tuple[torch.Tensor, ...] = (),
    pack_tokens: torch.Tensor | None = None,
    **_: Any,
) -> tuple[torch.Tensor, None]:
    """transformers' attention interface over a packed row: query, key and value are `[1, heads, tokens, dim]`;
    returns `[1, tokens, heads, dim]` as every attention function does. Each grid of sentences attends on its
    own, in the layout `[heads, sentences, length, dim]` (one gather of query, key and value together per grid,
    no transposes); softmax in the query's precision over the grid's additive padding bias, and a causal one
    where the model's attention module is causal (a grid row holds its sentence's tokens in order)."""
    if not pack_grids or len(pack_biases) != len(pack_grids) or pack_tokens is None:
        raise RuntimeError("packed attention called without the packing inputs (pack_grid_*, pack_tokens)")
    heads, dim = query.shape[1], query.shape[3]
    scale = scaling if scaling is not None else dim**-0.5
    if key.shape[1] != heads:  # grouped-query attention: each key head serves several query heads
        key = key.repeat_interleave(heads // key.shape[1], dim=1)
        value = value.repeat_interleave(heads // value.shape[1], dim=1)
    # query (scaled), key and value of every token, then one zero row that padded grid slots read
    qkv = torch.cat([query * scale, key, value], dim=0)
    qkv = torch.cat([qkv, qkv.new_zeros(3, heads, 1, dim)], dim=2)  # [3, heads, tokens + 1, dim]
    results = []
    for grid, bias in zip(pack_grids, pack_biases, strict=True):
        sentences, length = grid.shape
        laid = qkv.index_select(2, grid.reshape(-1)).reshape(3, heads, sentences, length, dim)
        scores = torch.matmul(laid[0], laid[1].transpose(-1, -2)) + bias.to(qkv.dtype)
        if getattr(module, "is_causal", False):
            later = torch.ones(length, length, dtype=torch.bool, device=qkv.device).triu(1)
            scores = scores.masked_fill(later, torch.finfo(qkv.dtype).min)
        out = torch.matmul(torch.softmax(scores, dim=-1), laid[2])
        results.append(out.reshape(heads, sentences * length, dim))
    out = torch.cat(results, dim=1).index_select(1, pack_tokens)  # [heads, tokens, dim]
    return out.transpose(0, 1).unsqueeze(0), None


def varlen_attention(
    module: nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    scaling: float | None = None,
    dropout: float = 0.0,
    pack_cu: torch.Tensor | None = None,
    pack_longest: int = 0,
    **_: Any,
) -> tuple[torch.Tensor, None]:
    """transformers' attention interface over a packed row whose sentences are spans (`pack_cu`): on a GPU
    FlashAttention runs on (flash_varlen_runs), FlashAttention's variable-length kernel (ATen's own, so that
    torch.export and AOTInductor keep it as one call); elsewhere the same spans as a block-diagonal mask, whose
    scores cover the whole row: quadratic in the batch's tokens, for small batches and checks, not for speed.
    Which one is decided when the model is traced, by the device it is traced on."""
    if pack_cu is None or not pack_longest:
        raise RuntimeError("varlen attention called without the packing inputs (pack_cu, the longest span)")
    causal = bool(getattr(module, "is_causal", False))
    heads, dim = query.shape[1], query.shape[3]
    scale = scaling if scaling is not None else dim**-0.5
    q, k, v = (t[0].transpose(0, 1).contiguous() for t in (query, key, value))  # [tokens, heads, dim]
    if flash_varlen_runs(q.device, dim, q.dtype):
        out = torch.ops.aten._flash_attention_forward(
            q, k, v, pack_cu, pack_cu, pack_longest, pack_longest, 0.0, causal, False, scale=scale
        )[0]
        return out.unsqueeze(0), None
    if k.shape[1] != heads:  # grouped-query attention: the kernel takes it as it is, the mask path does not
        k = k.repeat_interleave(heads // k.shape[1], dim=1)
        v = v.repeat_interleave(heads // v.shape[1], dim=1)
    place = torch.arange(q.shape[0], device=q.device)
    span = torch.searchsorted(pack_cu[1:].to(place.dtype), place, right=True)
    allowed = span[:, None] == span[None, :]
    if causal:
        allowed = allowed & (place[:, None] >= place[None, :])
    out = torch.nn.functional.scaled_dot_product_attention(
        q.transpose(0, 1), k.transpose(0, 1), v.transpose(0, 1), attn_mask=allowed, scale=scale
    )  # [heads, tokens, dim]
    return out.transpose(0, 1).unsqueeze(0), None


def flash_varlen_runs(device: torch.device, head_dim: int, dtype: torch.dtype) -> bool:
    """Whether ATen's FlashAttention kernel takes this: a CUDA GPU of compute capability 8.0 or later (Ampere
    on), FP16 or BF16, heads of at most 256 values."""
    if device.type != "cuda" or dtype not in (torch.float16, torch.bfloat16) or head_dim > 256:
        return False
    return torch.cuda.get_device_capability(device) >= (8, 0)


def padding_bias(grid: torch.Tensor, tokens: int | torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """A grid's additive attention bias, `[1, sentences, 1, length]`: the dtype's lowest value on the slots that
    hold no token (computed once per call, not once per layer)."""
    return ((grid >= tokens).to(dtype) * torch.finfo(dtype).min)[None, :, None, :]


def _register() -> None:
    from transformers import AttentionInterface

    AttentionInterface.register(ATTENTION, packed_attention)
    AttentionInterface.register(VARLEN, varlen_attention)


def transformer_of(module: nn.Module) -> nn.Module | None:
    """The transformers model inside the pipeline's wrapper (a sentence encoder, or a user's module bound to the
    recipe's inputs), or None."""
    inner = getattr(module, "encoder", None) if isinstance(module, SentenceEncoder) else None
    if isinstance(module, Bound):
        inner = module.inner
    return inner if inner is not None and hasattr(inner, "set_attn_implementation") else None


def why_not_packable(
    module: nn.Module, packing: Packing, outputs: list[str], per_token: list[str], longest: int | None = None
) -> str | None:
    """Why this model cannot run packed, in one sentence, or None. `longest`: the recipe's longest sequence, which
    a local attention window must cover (the packed attention attends over a whole sentence)."""
    model = transformer_of(module)
    if model is None:
        user = module.inner if isinstance(module, Bound) else module
        inside = next((m for m in user.modules() if hasattr(m, "set_attn_implementation")), None)
        if inside is not None:  # a user's module around a transformers model: its own code reads the layout
            return (
                f"packing needs the transformers model itself (it replaces the model's attention function): "
                f"{type(user).__name__} wraps {type(inside).__name__} in code of its own, which would read the "
                "packed rows; return the transformers model from the entrypoint to pack it"
            )
        return (
            "packing needs a transformers model (it replaces the model's attention function); this is not one"
        )
    if not getattr(model, "_supports_attention_backend", False):
        return f"{type(model).__name__} does not take a pluggable attention function"
    window = _attention_window(getattr(model, "config", None))
    if window is not None and (longest is None or window < longest):
        return (
            f"{type(model).__name__} attends within a local window of {window} tokens, shorter than the recipe's "
            f"sequences{f' (up to {longest})' if longest else ''}; the packed attention attends over whole sentences"
        )
    params = inspect.signature(model.forward).parameters
    if "position_ids" not in params and packing.position_input is None:
        return f"{type(model).__name__}.forward takes no position_ids, which a packed row needs"
    if isinstance(module, Bound):
        pooled = [name for name in outputs if name not in per_token]
        if pooled:
            return (
                f"output {pooled[0]!r} is not per-token (runtime.padding.per_token_outputs): the model's own "
                "pooling would read the packed row, not a sentence"
            )
    return None


def _attention_window(config: Any) -> int | None:
    """How far a token sees, where the model's config limits it: a sliding window (Mistral, Qwen2 when it uses
    one) or a local attention span (ModernBERT's local layers see half their window each way)."""
    sliding = getattr(config, "sliding_window", None)
    if isinstance(sliding, int) and getattr(config, "use_sliding_window", True) is not False:
        return sliding
    local = getattr(config, "local_attention", None)
    if isinstance(local, int):
        return local // 2
    return None


def position_rule(module: nn.Module) -> tuple[str, int]:
    """How the model numbers positions: ('column', 0), or ('offset', padding_idx + 1) for models that count real
    tokens from their padding index (RoBERTa and its kin keep `padding_idx` on their embeddings)."""
    model = transformer_of(module)
    embeddings = getattr(model, "embeddings", None)
    padding_idx = getattr(embeddings, "padding_idx", None)
    if isinstance(padding_idx, int):
        return "offset", padding_idx + 1
    return "column", 0


class PackedModel(nn.Module):
    """The pipeline's model taking packed feeds (the recipe's inputs in order, then Packing.extra_inputs) and
    returning the recipe's outputs in the padded layout:
    per-token outputs zero at padded positions, pooled outputs from the caller's mask."""

    def __init__(self, module: nn.Module, packing: Packing, input_names: list[str], outputs: list[str]):
        super().__init__()
        self.module = module
        self.packing = packing
        self.input_names = input_names
        self.outputs = outputs

    def graph_inputs(self) -> list[str]:
        return [*self.input_names, *self.packing.extra_inputs()]

    def forward(self, *args: torch.Tensor) -> tuple[torch.Tensor, ...]:
        given = dict(zip([*self.input_names, *self.packing.extra_inputs()], args, strict=True))
        mask = given[self.packing.mask]
        kwargs = {n: given[n] for n in self.input_names if n != self.packing.mask}
        if not self.packing.position_input:
            kwargs["position_ids"] = given["pack_positions"]
        model = transformer_of(self.module)
        assert model is not None
        if self.packing.attention == "varlen":
            raw = model(**kwargs, pack_cu=given["pack_cu"], pack_longest=self.packing.longest)
        else:
            grids = tuple(given[name] for name in grid_names(self.packing.groups))
            tokens = given["pack_tokens"].shape[0]
            dtype = next(model.parameters()).dtype
            biases = tuple(padding_bias(grid, tokens, dtype) for grid in grids)
            raw = model(**kwargs, pack_grids=grids, pack_biases=biases, pack_tokens=given["pack_tokens"])
        layout = given["pack_layout"].reshape(-1)

        def unpacked(x: torch.Tensor) -> torch.Tensor:  # [1, T, ...] -> [B, S, ...], zero at padding
            x = torch.cat([x[0], x.new_zeros(1, *x.shape[2:])], dim=0).index_select(0, layout)
            return x.reshape(mask.shape[0], mask.shape[1], *x.shape[1:])

        if isinstance(self.module, SentenceEncoder):
            hidden = unpacked(raw.last_hidden_state)
            found = {"last_hidden_state": hidden}
            if "sentence_embedding" in self.outputs:
                found["sentence_embedding"] = mean_pool(hidden, mask, self.module.normalize)
            return tuple(found[name] for name in self.outputs)
        return tuple(unpacked(x) for x in pick_outputs(raw, self.outputs))


@contextlib.contextmanager
def packed_attention_on(module: nn.Module, packing: Packing) -> Iterator[None]:
    """The model's attention switched to the packing's while the block runs (tracing bakes it into the graph),
    and back after: the same module serves the padded reference in this process."""
    model = transformer_of(module)
    assert model is not None
    _register()
    before = model.config._attn_implementation
    model.set_attn_implementation(VARLEN if packing.attention == "varlen" else ATTENTION)
    try:
        yield
    finally:
        model.set_attn_implementation(before)


def check_exact(
    module: nn.Module, packed: PackedModel, feeds: dict[str, Any], packing: Packing, per_token: list[str]
) -> str | None:
    """Why the packed model does not reproduce the padded one on this batch (real tokens, pooled outputs), or
    None. Tolerance: FP32 rounding of a reordered sum, 1e-4 relative to the output's scale."""
    padded = module(*(torch.from_numpy(feeds[n]) for n in packed.input_names))
    packed_feeds = packing.pack(feeds)
    with packed_attention_on(module, packing):
        got = packed(*(torch.from_numpy(packed_feeds[n]) for n in packed.graph_inputs()))
    real = torch.from_numpy(feeds[packing.mask] != 0)
    for name, want, have in zip(packed.outputs, padded, got, strict=True):
        if name in per_token:
            want, have = want[real], have[real]
        if want.shape != have.shape:
            return f"output {name!r}: shape {tuple(have.shape)} packed, {tuple(want.shape)} padded"
        if not want.is_floating_point():
            if not torch.equal(want, have):
                return f"output {name!r} differs on real tokens"
            continue
        scale = float(want.abs().max()) or 1.0
        diff = float((want.float() - have.float()).abs().max())
        if not diff <= 1e-4 * scale:
            return f"output {name!r} differs by {diff:.3g} on real tokens (largest value {scale:.3g})"
    return None
