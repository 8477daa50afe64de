"""The winner as an MLflow model: the shipped file in MLflow's own model format (an MLmodel with its flavour
and a tensor signature), so that `mlflow.onnx.load_model("runs:/<id>/model")` or
`mlflow.pyfunc.load_model` opens exactly what was signed off. The signature comes from the ONNX graph the
winner shares (itself, or the FP32 export beside a TorchScript winner). Other artifact kinds have no MLflow
flavour: the run says so and keeps their file among its sign-off artifacts."""

from __future__ import annotations

import json
import tempfile
from pathlib import Path
from typing import Any

MODEL_PATH = "model"


def save_winner(version: Path, folder: Path) -> str:
    """Save the winner as an MLflow model into `folder`; returns its flavour. Raises ValueError with the
    reason when the winner has no flavour (the caller says it was not logged)."""
    winner = json.loads((version / "winner.json").read_text())
    manifest = json.loads((version / "manifest.json").read_text())
    artifacts = {a["name"]: a for a in manifest.get("artifacts") or []}
    entry = artifacts.get(winner["artifact"])
    if entry is None:
        raise ValueError(f"{winner['artifact']} is not among the version's artifacts")
    source = entry if entry["kind"] == "onnx" else artifacts.get("onnx-fp32")
    signature = _signature(version / source["path"]) if source else None
    path = version / (winner.get("file") or entry["path"])
    if entry["kind"] == "onnx":
        import mlflow.onnx
        import onnx

        mlflow.onnx.save_model(onnx.load(str(path)), str(folder), signature=signature)
        return "onnx"
    if entry["kind"] == "torchscript":
        import mlflow.pytorch
        import torch

        mlflow.pytorch.save_model(
            torch.jit.load(str(path), map_location="cpu"), str(folder), signature=signature
        )
        return "pytorch"
    raise ValueError(f"MLflow has no model flavour for a {entry['kind']} artifact ({winner['artifact']})")


def log_winner(client: Any, run_id: str, version: Path) -> str:
    """Log the winner under the run's `model/`; returns what happened, for the tracking line."""
    with tempfile.TemporaryDirectory(prefix="pipeline-mlflow-model-") as tmp:
        folder = Path(tmp) / MODEL_PATH
        try:
            flavour = save_winner(version, folder)
        except (ValueError, ImportError) as exc:
            return f"winner not logged as an MLflow model: {exc}"
        client.log_artifacts(run_id, str(folder), MODEL_PATH)
    return f"winner logged as an MLflow model ({flavour}, runs:/{run_id}/{MODEL_PATH})"


def _signature(onnx_path: Path) -> Any:
    """The graph's inputs and outputs as MLflow tensor specs (symbolic dims as -1)."""
    import numpy as np
    import onnx
    from mlflow.models import ModelSignature
    from mlflow.types.schema import Schema, TensorSpec

    graph = onnx.load(str(onnx_path), load_external_data=False).graph

    def spec(value: onnx.ValueInfoProto) -> TensorSpec:
        tensor = value.type.tensor_type
        dtype = np.dtype(onnx.helper.tensor_dtype_to_np_dtype(tensor.elem_type))
        shape = tuple(d.dim_value if d.dim_value > 0 else -1 for d in tensor.shape.dim)
        return TensorSpec(dtype, shape, value.name)

    return ModelSignature(Schema([spec(v) for v in graph.input]), Schema([spec(v) for v in graph.output]))
