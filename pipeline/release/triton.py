"""Serving hand-off: with `export.triton: true`, the version folder holds a Triton Inference Server model
repository of the winner, `triton/<name>/config.pbtxt` + `triton/<name>/<N>/model.onnx` (or `model.plan`, or
`model.pt`), where N is the release number (v0003: 3), so that `tritonserver --model-repository=<version>/triton`
serves what was signed off under the version number of its release (one config.pbtxt per model: merging the
folders of releases whose winners differ in backend or tensors would need a model name per release).

The configuration comes from what was measured and exported, not from guesses: element types from the ONNX
graph the served artifact was exported beside (itself, the graph an engine was built from, or the FP32 export of
a TorchScript model), dims from the recipe (batch axis stripped when every input and output is batched along
it), max_batch_size from the batch dim's max, preferred batch sizes where the benchmark saw throughput grow,
the queue delay from the recipe (`export.triton_queue_delay_us`, default 0: no request waits for a batch to
fill unless asked), a warm-up request at the recipe's opt shape so the first real request does not pay for
loading, the instance kind from the winner's runtime, and ONNX Runtime's intra-op threads as benchmarked.
TorchScript has no tensor names: Triton's INPUT__i / OUTPUT__i, mapped to the recipe's names in names.json."""

from __future__ import annotations

import json
import math
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
NAMES = "names.json"  # Triton tensor name -> the recipe's, where the backend renames them (TorchScript)
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
    outputs: list[str]
    dims: dict[str, DimRange]
    batch_dim: str
    queue_delay_us: int

    @classmethod
    def from_recipe(cls, recipe: Recipe) -> ServingSpec:
        return cls(
            enabled=recipe.export.triton,
            name=recipe.name,
            inputs=list(recipe.inputs),
            outputs=list(recipe.outputs),
            dims=dict(recipe.dims),
            batch_dim=recipe.benchmark.batch_dim,
            queue_delay_us=recipe.export.triton_queue_delay_us,
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
    if entry["kind"].endswith("-packed"):
        return (
            "a packed graph takes a batch packed on the host (pipeline/core/packing.py), which Triton's "
            "backends do not do: serve onnx-fp32, or run the packed graph in process"
        )
    if entry["kind"] not in PLATFORMS:
        return f"Triton has no backend for a {entry['kind']} artifact"
    if entry["kind"] == "engine" and parse(entry["name"]).flavour == "tensorrt-rtx":
        return "Triton's TensorRT backend loads TensorRT engines, not TensorRT-RTX engines: serve the ONNX"
    if source is None:
        return "no ONNX export of the winner to take its signature from"
    return None


def model_version(release: str) -> str:
    """Triton's version folder of a release: its number (v0003 -> 3)."""
    digits = release.lstrip("v")
    return str(int(digits)) if digits.isdigit() else "1"


def write_model_repository(
    workdir: Path,
    spec: ServingSpec,
    winner: dict[str, Any] | None,
    artifacts: list[dict[str, Any]],
    speed: dict[str, Any],
    release: str = "v0001",
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
    number = model_version(release)
    (model_dir / number).mkdir(parents=True, exist_ok=True)
    shutil.copyfile(workdir / entry["path"], model_dir / number / filename)
    names = tensor_names(spec, platform, graph)
    config = model_config(spec, winner, platform, graph, speed, source["name"], names)
    write_text_atomic(model_dir / "config.pbtxt", config)
    written = [f"{FOLDER}/{spec.name}/config.pbtxt", f"{FOLDER}/{spec.name}/{number}/{filename}"]
    if any(name != recipe for name, recipe in names.items()):
        inputs = {n: r for n, r in names.items() if n.startswith("INPUT__")}
        outputs = {n: r for n, r in names.items() if not n.startswith("INPUT__")}
        mapping = {"inputs": inputs, "outputs": outputs}
        write_text_atomic(model_dir / NAMES, json.dumps(mapping, indent=2) + "\n")
        written.append(f"{FOLDER}/{spec.name}/{NAMES}")
    return written


def tensor_names(spec: ServingSpec, platform: str, graph: onnx.GraphProto) -> dict[str, str]:
    """Triton's name of every input, then every output -> the recipe's (the ONNX graph's for outputs beyond
    the recipe's): the same name except where the backend has none (TorchScript: INPUT__i, OUTPUT__i)."""
    recipe_inputs = [s.name for s in spec.inputs]
    recipe_outputs = [
        spec.outputs[i] if i < len(spec.outputs) else value.name for i, value in enumerate(graph.output)
    ]
    if platform == "pytorch_libtorch":
        return {
            **{f"INPUT__{i}": name for i, name in enumerate(recipe_inputs)},
            **{f"OUTPUT__{i}": name for i, name in enumerate(recipe_outputs)},
        }
    return {**{n: n for n in recipe_inputs}, **{v.name: v.name for v in graph.output}}


def config_problems(folder: Path) -> list[str]:
    """`path: why` for each config.pbtxt of the version's Triton repository that Triton's own ModelConfig
    protobuf does not parse, or that breaks a rule Triton checks as it loads the model (tensor_problems); none
    checked when tritonclient, which carries the protobuf, is not installed."""
    try:
        from google.protobuf import text_format
        from tritonclient.grpc import model_config_pb2
    except ImportError:
        return []
    problems = []
    for path in sorted((folder / FOLDER).glob("*/config.pbtxt")):
        where = path.relative_to(folder).as_posix()
        config = model_config_pb2.ModelConfig()
        try:
            text_format.Parse(path.read_text(errors="replace"), config)
        except text_format.ParseError as exc:
            problems.append(f"{where}: not a Triton model configuration ({exc})")
            continue
        problems += [f"{where}: {why}" for why in tensor_problems(config)]
    return problems


def tensor_problems(config: Any) -> list[str]:
    """What Triton refuses as it loads a parsed ModelConfig's tensors: an input or output without dims (Triton:
    "must specify 'dims'"; one value per sample is dims [ 1 ] reshaped to [ ]), a dim that is neither -1 nor a
    size, or a reshape to a different fixed number of elements."""
    problems = []
    for kind, tensors in (("input", config.input), ("output", config.output)):
        for tensor in tensors:
            dims = list(tensor.dims)
            if not dims:
                problems.append(
                    f"model {kind} '{tensor.name}' must specify 'dims' (Triton does not load it; a tensor of "
                    "one value per sample is dims: [ 1 ] with reshape: { shape: [ ] })"
                )
            elif any(d == 0 or d < -1 for d in dims):
                problems.append(f"model {kind} '{tensor.name}' has dims {dims}: each is -1 or a size")
            elif tensor.HasField("reshape") and _differ(dims, list(tensor.reshape.shape)):
                problems.append(
                    f"model {kind} '{tensor.name}' reshapes dims {dims} to {list(tensor.reshape.shape)}: "
                    "a different number of elements"
                )
    return problems


def _differ(dims: list[int], reshaped: list[int]) -> bool:
    """Whether two fixed shapes hold different numbers of elements (one with a -1 may hold any)."""
    if -1 in dims or -1 in reshaped:
        return False
    return math.prod(dims) != math.prod(reshaped)


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
    """Triton's dims of a tensor: -1 where the size varies, the batch axis stripped where Triton batches.
    Empty for a tensor that is only the batch axis (one value per sample): see `_tensor` for how it is
    written."""
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
    """One input or output. Triton requires non-empty dims: a tensor that is only the batch axis ([batch], one
    value per sample) is `dims: [ 1 ]` with `reshape: { shape: [ ] }`, Triton's documented form for it (clients
    send and receive [batch, 1]; the model sees [batch])."""
    shown = ", ".join(str(d) for d in dims) if dims else "1"
    reshape = "" if dims else "\n    reshape: { shape: [ ] }"
    return f'  {{\n    name: "{name}"\n    data_type: {data_type}\n    dims: [ {shown} ]{reshape}\n  }}'


def model_config(
    spec: ServingSpec,
    winner: dict[str, Any],
    platform: str,
    graph: onnx.GraphProto,
    speed: dict[str, Any],
    signature: str,
    names: dict[str, str],
) -> str:
    """config.pbtxt; `signature`: the ONNX artifact whose graph gave the element types; `names`: Triton's
    tensor names, inputs then outputs (tensor_names)."""
    strip = batched(spec, graph)
    max_batch = spec.dims[spec.batch_dim].max if strip else 0
    types = {v.name: v.type.tensor_type.elem_type for v in [*graph.input, *graph.output]}
    served = list(names)
    input_names, output_names = served[: len(spec.inputs)], served[len(spec.inputs) :]
    inputs = [
        _tensor(name, TRITON_TYPES[types[inp.name]], tensor_dims(list(inp.shape), strip))
        for name, inp in zip(input_names, spec.inputs, strict=True)
    ]
    outputs = [
        _tensor(name, TRITON_TYPES[value.type.tensor_type.elem_type], tensor_dims(graph_dims(value), strip))
        for name, value in zip(output_names, graph.output, strict=True)
    ]
    gpu = registry.on_gpu(winner["runtime"])
    own = signature == winner["artifact"]
    source = "its own ONNX graph" if own else f"the ONNX export it shares its signature with ({signature})"
    lines = [
        f"# {spec.name}: the signed-off winner {winner['artifact']} ({winner['runtime']}), written by the",
        f"# deploy pipeline from {source}, the recipe's dims and the benchmark.",
    ]
    if platform == "pytorch_libtorch":
        mapping = ", ".join(f"{n} = {r}" for n, r in names.items())
        lines.append(f"# TorchScript tensors have no names: {mapping} ({NAMES}).")
    lines += [
        f'name: "{spec.name}"',
        f'platform: "{platform}"',
        f"max_batch_size: {max_batch}",
        "input [\n" + ",\n".join(inputs) + "\n]",
        "output [\n" + ",\n".join(outputs) + "\n]",
    ]
    if max_batch:
        lines.append(_dynamic_batching(winner, speed, max_batch, spec.queue_delay_us))
    lines.append(
        f"instance_group [\n  {{\n    count: 1\n    kind: {'KIND_GPU' if gpu else 'KIND_CPU'}\n  }}\n]"
    )
    threads = (speed.get("conditions") or {}).get("intra_op_threads")
    if platform == "onnxruntime_onnx" and not gpu and threads:
        lines.append(
            f'parameters {{\n  key: "intra_op_thread_count"\n  value: {{ string_value: "{threads}" }}\n}}'
        )
    lines.append(_warmup(spec, input_names, types, strip))
    return "\n".join(lines) + "\n"


def _warmup(spec: ServingSpec, names: list[str], types: dict[str, int], strip: bool) -> str:
    """One request of zeros at the recipe's opt shape (batch 1), run by Triton as it loads the model."""
    entries = []
    for name, inp in zip(names, spec.inputs, strict=True):
        dims = [spec.dims[d].opt if isinstance(d, str) and d in spec.dims else d for d in inp.shape]
        dims = [1 if d == -1 or not isinstance(d, int) else d for d in dims]
        shown = ", ".join(str(d) for d in (dims[1:] if strip else dims)) or "1"  # as _tensor: [ 1 ], reshaped
        entries.append(
            f'    inputs {{\n      key: "{name}"\n      value {{\n        data_type: {TRITON_TYPES[types[inp.name]]}\n'
            f"        dims: [ {shown} ]\n        zero_data: true\n      }}\n    }}"
        )
    batch = "    batch_size: 1\n" if strip else ""
    return 'model_warmup [\n  {\n    name: "opt shape, zeros"\n' + batch + "\n".join(entries) + "\n  }\n]"


def _dynamic_batching(winner: dict[str, Any], speed: dict[str, Any], max_batch: int, delay_us: int) -> str:
    """Preferred sizes where the benchmark saw throughput grow; the queue delay as the recipe says (Triton's
    batcher then only joins requests already waiting, unless the recipe trades latency for fuller batches)."""
    preferred = preferred_batch_sizes(winner, speed, max_batch)
    body = []
    if preferred:
        body.append(f"  preferred_batch_size: [ {', '.join(str(b) for b in preferred)} ]")
    body.append(f"  max_queue_delay_microseconds: {delay_us}")
    return "dynamic_batching {\n" + "\n".join(body) + "\n}"
