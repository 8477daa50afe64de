"""Defaults that depend on what the model is. A BERT encoder wants its feed-forward layers kept out of INT8, the
transformer optimizer and a sequence length of 128; a CNN wants its Convs quantized, ONNX Runtime's plain graph
optimizations, and no sequence length at all. So these keys have no fixed default: when the recipe leaves one
out, it is filled in here, before validation, from the model family (`model.family`, else transformer for a
Hugging Face text model and generic for everything else) and from the recipe's own dims. Pure: no I/O."""

from __future__ import annotations

import copy
from typing import Any

# family -> {dotted key: default}; every key here is left empty by the schema and filled by family
FAMILY_DEFAULTS: dict[str, dict[str, Any]] = {
    "transformer": {
        # GPT-2's linears are Conv1D modules, exported as Gemm: both kinds of weight op
        "export.int8.op_types": ["MatMul", "Gemm"],
        # the feed-forward layers, found from the graph whatever the modules are named (why they stay in
        # float: docs/benchmarking.md)
        "export.int8.exclude_feed_forward": True,
        "export.optimize.model_type": "bert",
    },
    "generic": {
        "export.int8.op_types": ["Conv", "MatMul", "Gemm"],
        "export.int8.exclude_feed_forward": False,
        "export.optimize.model_type": None,
    },
}


def family_of(data: dict[str, Any]) -> str:
    """The declared family, else transformer for a huggingface source and generic otherwise."""
    model = data.get("model")
    if not isinstance(model, dict):
        return "generic"
    declared = model.get("family")
    if declared in FAMILY_DEFAULTS:
        return declared
    return "transformer" if model.get("source") == "huggingface" else "generic"


def _sequence_lengths(data: dict[str, Any]) -> list[int] | None:
    """[opt] of the sequence dim, [] when the recipe has none; None when the dims are too broken to tell
    (validation then reports them)."""
    bench = data.get("benchmark") if isinstance(data.get("benchmark"), dict) else {}
    dims = data.get("dims", {})
    name = bench.get("sequence_dim", "sequence")
    if not isinstance(dims, dict) or not isinstance(name, str | None):
        return None
    rng = dims.get(name) if name else None
    if rng is None:
        return []
    opt = rng.get("opt") if isinstance(rng, dict) else None
    return [opt] if isinstance(opt, int) and not isinstance(opt, bool) and opt > 0 else None


def _set_default(data: dict[str, Any], key: str, value: Any) -> None:
    """Set a dotted key unless the recipe gives it; parents that are not mappings are left for validation."""
    *parents, last = key.split(".")
    node = data
    for part in parents:
        child = node.setdefault(part, {})
        if not isinstance(child, dict):
            return
        node = child
    node.setdefault(last, copy.deepcopy(value))


def with_family_defaults(data: Any) -> Any:
    """A copy of the raw recipe mapping with the family defaults and the dims-derived sequence lengths in
    every place the recipe leaves empty (the caller's mapping is not changed)."""
    if not isinstance(data, dict):
        return data
    data = copy.deepcopy(data)
    for key, value in FAMILY_DEFAULTS[family_of(data)].items():
        _set_default(data, key, value)
    lengths = _sequence_lengths(data)
    if lengths is not None:
        _set_default(data, "benchmark.sequence_lengths", lengths)
    return data
