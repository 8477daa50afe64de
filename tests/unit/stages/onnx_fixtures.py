"""Shared helpers for the ONNX precision-stage tests: dynamo exports of real models, artifact records,
ONNX Runtime sessions and the comparison metrics."""

from __future__ import annotations

import hashlib
from pathlib import Path

import numpy as np
import onnx
import torch

from pipeline.core.artifacts import ArtifactRecord
from pipeline.inputs.export_dims import input_axes, symbolic_dims
from pipeline.recipe.loader import load
from tests.stage_env import StageEnv

TINY = Path(__file__).resolve().parents[2] / "recipes" / "tiny.yaml"


def tiny_context(workdir: Path, *overrides: str) -> StageEnv:
    return StageEnv(load(TINY, list(overrides)).recipe, TINY.parent, workdir)


def record(path: Path, name: str = "onnx-fp32", precision: str = "fp32") -> ArtifactRecord:
    digest = hashlib.sha256(path.read_bytes()).hexdigest()
    return ArtifactRecord(name=name, path=path, kind="onnx", precision=precision, sha256=digest, stage="test")


def dynamo_export(ctx: StageEnv, path: Path, example: dict[str, np.ndarray]) -> ArtifactRecord:
    """Export the recipe's model with the dynamo exporter, one symbolic axis per recipe dim (as export_onnx
    does). The example must be representative: a BERT exported from an all-ones mask drops the mask."""
    recipe = ctx.recipe
    dims = symbolic_dims(recipe.dims)
    dynamic = tuple(input_axes(s.shape, dims) for s in recipe.inputs)
    args = tuple(torch.from_numpy(example[s.name]) for s in recipe.inputs)
    with torch.no_grad():
        program = torch.onnx.export(
            ctx.model().module,
            args,
            dynamo=True,
            dynamic_shapes=(dynamic,),
            input_names=[s.name for s in recipe.inputs],
            output_names=list(recipe.outputs),
            opset_version=recipe.export.onnx.opset,
            verbose=False,
        )
    program.save(str(path), external_data=False)
    return record(path)


def reference(ctx: StageEnv, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """The eager FP32 module's outputs by name."""
    with torch.no_grad():
        out = ctx.model().module(*(torch.from_numpy(feeds[s.name]) for s in ctx.recipe.inputs))
    return {name: t.numpy() for name, t in zip(ctx.recipe.outputs, out, strict=True)}


def run_onnx(path: Path, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = 2
    session = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
    wanted = {i.name for i in session.get_inputs()}
    outputs = session.run(None, {k: v for k, v in feeds.items() if k in wanted})
    return {o.name: v for o, v in zip(session.get_outputs(), outputs, strict=True)}


def lowest_cosine(a: np.ndarray, b: np.ndarray) -> float:
    """Lowest per-row cosine similarity (rows = samples)."""
    a, b = a.reshape(len(a), -1).astype(np.float64), b.reshape(len(b), -1).astype(np.float64)
    cos = (a * b).sum(1) / (np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1))
    return float(cos.min())


def producers(model: onnx.ModelProto) -> dict[str, onnx.NodeProto]:
    return {o: n for n in model.graph.node for o in n.output}


_TINY_EXPORTS: dict[Path, ArtifactRecord] = {}


def tiny_onnx(factory) -> ArtifactRecord:
    """The tiny encoder exported once per test session (dynamo), shared by the stage test modules."""
    base = factory.getbasetemp()
    if base not in _TINY_EXPORTS:
        folder = factory.mktemp("tiny-dynamo")
        ctx = tiny_context(folder)
        _TINY_EXPORTS[base] = dynamo_export(
            ctx, folder / "model.onnx", ctx.dataset().feeds_at({"batch": 2, "sequence": 16})
        )
    return _TINY_EXPORTS[base]
