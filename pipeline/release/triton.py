"""Serving hand-off: with `export.triton: true`, the version folder holds a Triton Inference Server model
repository of the winner, `triton/<name>/config.pbtxt` + `triton/<name>/1/model.onnx` (or `model.plan`, or
`model.pt`), so that `tritonserver --model-repository=<version>/triton` serves what was signed off.

The configuration comes from what was measured and exported, not from guesses: tensor names and element
types from the artifact's ONNX signature, dims from the recipe (batch axis stripped when every input and
output is batched along it), max_batch_size from the batch dim's max, preferred batch sizes where the
benchmark saw throughput grow, the queue delay from the winner's batch-1 latency, the instance kind from the
winner's runtime, and ONNX Runtime's intra-op threads as benchmarked."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import onnx
from pydantic import BaseModel, ConfigDict

from pipeline.check.speed import THROUGHPUT
from pipeline.check.timings import timings
from pipeline.core.files import write_text_atomic
from pipeline.core.variants import parse
from pipeline.recipe import DimRange, InputSpec, Recipe
from pipeline.runners import registry

FOLDER = "triton"
TRITON_TYPES = {
    onnx.TensorProto.FLOAT: "TYPE_FP32",
    onnx.TensorProto.FLOAT16: "TYPE_FP16",
    onnx.TensorProto.BFLOAT16: "TYPE_BF16",
    onnx.TensorProto.DOUBLE: "TYPE_FP64",
    onnx.TensorProto.INT64: "TYPE_INT64",
    onnx.TensorProto.INT32: "TYPE_INT32",
    onnx.TensorProto.INT8: "TYPE_INT8",
    onnx.TensorProto.UINT8: "TYPE_UINT8",
    onnx.TensorProto.BOOL: "TYPE_BOOL",
}
# artifact kind -> (Triton platform or backend, model file name inside the version folder "1/")
PLATFORMS = {
    "onnx": ("onnxruntime_onnx", "model.onnx"),
    "engine": ("tensorrt_plan", "model.plan"),
    "torchscript": ("pytorch_libtorch", "model.pt"),
}


class ServingSpec(BaseModel):
    """What a Triton configuration is written from besides the winner: the model's name, its inputs and dims,
    and which dim is the batch axis; `enabled` is export.triton."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    enabled: bool
    name: str
    inputs: list[InputSpec]
    dims: dict[str, DimRange]
    batch_dim: str

    @classmethod
    def from_recipe(cls, recipe: Recipe) -> ServingSpec:
        return cls(
            enabled=recipe.export.triton,
            name=recipe.name,
            inputs=list(recipe.inputs),
            dims=dict(recipe.dims),
            batch_dim=recipe.benchmark.batch_dim,
        )


def artifact_entry(winner: dict[str, Any], artifacts: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The manifest entry of the winner; its file is winner.json's `file` when present, else the manifest's
    path for the winner's name."""
    entry = next((a for a in artifacts if a["name"] == winner["artifact"]), None)
    if entry is not None and winner.get("file"):
        entry = {**entry, "path": winner["file"]}
    return entry


def signature_source(entry: dict[str, Any], artifacts: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The ONNX whose signature the served artifact has: itself, the ONNX an engine was built from, or the
    FP32 ONNX export of a TorchScript winner (same model, same inputs and outputs)."""
    if entry["kind"] == "onnx":
        return entry
    wanted = parse(entry["name"]).built_from if entry["kind"] == "engine" else "onnx-fp32"
    return next((a for a in artifacts if a["name"] == wanted), None)


def unservable(entry: dict[str, Any] | None, source: dict[str, Any] | None) -> str | None:
    if entry is None:
        return "the winner is not among the version's artifacts"
    if entry["kind"] not in PLATFORMS:
        return f"Triton has no backend for a {entry['kind']} artifact"
    if entry["kind"] == "engine" and parse(entry["name"]).flavour == "tensorrt-rtx":
        return "Triton's TensorRT backend loads TensorRT engines, not TensorRT-RTX engines: serve the ONNX"
    if source is None:
        return "no ONNX export of the winner to take its signature from"
    return None


def write_model_repository(
    workdir: Path,
    spec: ServingSpec,
    winner: dict[str, Any] | None,
    artifacts: list[dict[str, Any]],
    speed: dict[str, Any],
) -> list[str]:
    """Write triton/ into the version's work folder (before the manifest); returns the files written."""
    if not spec.enabled or winner is None:
        return []
    entry = artifact_entry(winner, artifacts)
    source = signature_source(entry, artifacts) if entry else None
    why_not = unservable(entry, source)
    if why_not:
        write_text_atomic(workdir / FOLDER / "README.md", f"No Triton model repository: {why_not}.\n")
        return [f"{FOLDER}/README.md"]
    assert entry is not None and source is not None
    platform, filename = PLATFORMS[entry["kind"]]
    graph = onnx.load(str(workdir / source["path"]), load_external_data=False).graph
    model_dir = workdir / FOLDER / spec.name
    (model_dir / "1").mkdir(parents=True, exist_ok=True)
    shutil.copyfile(workdir / entry["path"], model_dir / "1" / filename)
    config = model_config(spec, winner, platform, graph, speed)
    write_text_atomic(model_dir / "config.pbtxt", config)
    return [f"{FOLDER}/{spec.name}/config.pbtxt", f"{FOLDER}/{spec.name}/1/{filename}"]


# ---------------------------------------------------------------- config.pbtxt


def batched(spec: ServingSpec, graph: onnx.GraphProto) -> bool:
    """Triton batches along the first axis of every input and output: only when all of them lead with the
    recipe's batch dim may max_batch_size be set."""
    batch = spec.batch_dim
    if batch not in spec.dims:
        return False
    firsts = [inp.shape[0] if inp.shape else None for inp in spec.inputs]
    for value in graph.output:
        dims = value.type.tensor_type.shape.dim
        firsts.append(dims[0].dim_param if dims else None)
    return all(first == batch for first in firsts)


def tensor_dims(dims: list[int | str], strip_batch: bool) -> list[int]:
    out = [d if isinstance(d, int) and d > 0 else -1 for d in dims]
    return out[1:] if strip_batch else out


def graph_dims(value: onnx.ValueInfoProto) -> list[int | str]:
    return [d.dim_value or d.dim_param or -1 for d in value.type.tensor_type.shape.dim]


def preferred_batch_sizes(winner: dict[str, Any], speed: dict[str, Any], max_batch: int) -> list[int]:
    """Batch sizes above 1 at which the winner's throughput beats every smaller measured batch size: worth
    waiting for. The throughput run's sequences/s where the rows have one (GPU rows, or every row under a
    throughput objective), else batch / p50 of calls made one at a time (a CPU runtime serves that way)."""
    key = (winner["artifact"], winner["runtime"], winner.get("io", "host"))
    best: dict[int, float] = {}
    for row in timings(speed):
        if (row.artifact, row.runtime, row.io) != key or row.batch is None:
            continue
        rate = row.value(THROUGHPUT)
        if rate is None and row.p50_ms:
            rate = 1000.0 * row.batch / row.p50_ms
        if rate is not None:
            best[row.batch] = max(best.get(row.batch, 0.0), rate)
    chosen, top = [], 0.0
    for batch in sorted(best):
        if batch > 1 and best[batch] > top and batch <= max_batch:
            chosen.append(batch)
        top = max(top, best[batch])
    return chosen


def _tensor(name: str, data_type: str, dims: list[int]) -> str:
    shown = ", ".join(str(d) for d in dims)
    return f'  {{\n    name: "{name}"\n    data_type: {data_type}\n    dims: [ {shown} ]\n  }}'


def model_config(
    spec: ServingSpec, winner: dict[str, Any], platform: str, graph: onnx.GraphProto, speed: dict[str, Any]
) -> str:
    strip = batched(spec, graph)
    max_batch = spec.dims[spec.batch_dim].max if strip else 0
    types = {v.name: v.type.tensor_type.elem_type for v in [*graph.input, *graph.output]}
    names = {"inputs": [s.name for s in spec.inputs], "outputs": [o.name for o in graph.output]}
    if platform == "pytorch_libtorch":  # TorchScript has no tensor names: Triton's INPUT__i convention
        names = {
            "inputs": [f"INPUT__{i}" for i in range(len(spec.inputs))],
            "outputs": [f"OUTPUT__{i}" for i in range(len(graph.output))],
        }
    inputs = [
        _tensor(name, TRITON_TYPES[types[inp.name]], tensor_dims(list(inp.shape), strip))
        for name, inp in zip(names["inputs"], spec.inputs, strict=True)
    ]
    outputs = [
        _tensor(name, TRITON_TYPES[value.type.tensor_type.elem_type], tensor_dims(graph_dims(value), strip))
        for name, value in zip(names["outputs"], graph.output, strict=True)
    ]
    gpu = registry.on_gpu(winner["runtime"])
    lines = [
        f"# {spec.name}: the signed-off winner {winner['artifact']} ({winner['runtime']}), written by the",
        "# deploy pipeline from the artifact's ONNX signature, the recipe's dims and the benchmark.",
        f'name: "{spec.name}"',
        f'platform: "{platform}"',
        f"max_batch_size: {max_batch}",
        "input [\n" + ",\n".join(inputs) + "\n]",
        "output [\n" + ",\n".join(outputs) + "\n]",
    ]
    if max_batch:
        lines.append(_dynamic_batching(winner, speed, max_batch))
    lines.append(
        f"instance_group [\n  {{\n    count: 1\n    kind: {'KIND_GPU' if gpu else 'KIND_CPU'}\n  }}\n]"
    )
    threads = (speed.get("conditions") or {}).get("intra_op_threads")
    if platform == "onnxruntime_onnx" and not gpu and threads:
        lines.append(
            f'parameters {{\n  key: "intra_op_thread_count"\n  value: {{ string_value: "{threads}" }}\n}}'
        )
    return "\n".join(lines) + "\n"


def _dynamic_batching(winner: dict[str, Any], speed: dict[str, Any], max_batch: int) -> str:
    preferred = preferred_batch_sizes(winner, speed, max_batch)
    single = [
        r.p50_ms
        for r in timings(speed)
        if (r.artifact, r.runtime, r.batch) == (winner["artifact"], winner["runtime"], 1) and r.p50_ms
    ]
    body = []
    if preferred:
        body.append(f"  preferred_batch_size: [ {', '.join(str(b) for b in preferred)} ]")
    if single:  # wait at most one batch-1 inference for a batch to fill
        body.append(f"  max_queue_delay_microseconds: {max(1, round(min(single) * 1000))}")
    return "dynamic_batching {\n" + "\n".join(body) + ("\n" if body else "") + "}"
