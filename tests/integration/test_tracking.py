"""Run records a team can rely on: a required record that cannot be written fails the exit code (the version
stays published), and a deploy that changed nothing says it logged nothing."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.integration.test_deploy_cli import TINY, cli

pytest.importorskip("mlflow", reason="the mlflow extra: pip install 'deploy-pipeline[mlflow]'")


def test_a_required_record_that_fails_fails_the_exit_code(tmp_path: Path) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    store = ["--set", f"tracking.mlflow.uri={blocker / 'mlruns'}"]  # a store that cannot be created
    failed = cli("deploy", str(TINY), *store, "--set", "tracking.required=true", root=tmp_path / "out")
    assert failed.returncode == 1, failed.stdout[-2000:] + failed.stderr[-2000:]
    assert "tracking failed (the release stands): NotADirectoryError" in failed.stdout
    assert "the run could not be logged and tracking.required is true" in failed.stdout
    assert (tmp_path / "out" / "tiny" / "latest").readlink() == Path("v0001")  # published all the same
    again = cli("deploy", str(TINY), *store, "--set", "tracking.required=true", root=tmp_path / "out")
    assert again.returncode == 1 and "up to date: tiny/v0001" in again.stdout  # still no record: not bypassed
    lenient = cli(
        "deploy", str(TINY), *store, "--set", "export.triton=true", "--promote", root=tmp_path / "out"
    )
    assert lenient.returncode == 0 and "tracking failed (the release stands)" in lenient.stdout
    fixed = ["--set", f"tracking.mlflow.uri={tmp_path / 'mlruns'}", "--set", "tracking.required=true"]
    logged = cli("deploy", str(TINY), *fixed, "--set", "export.triton=true", root=tmp_path / "out")
    assert logged.returncode == 0 and "tracking: mlflow run " in logged.stdout  # the missing run, logged now
    stands = cli("deploy", str(TINY), *fixed, "--set", "export.triton=true", root=tmp_path / "out")
    assert stands.returncode == 0 and "tracking: not logged: up to date (run " in stands.stdout


def test_a_local_sqlite_store_opens_with_mlflows_own_client(tmp_path: Path, monkeypatch) -> None:
    pytest.importorskip("sqlalchemy", reason="the mlflow extra brings sqlalchemy for a sqlite store")
    from mlflow import MlflowClient

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    result = cli("deploy", str(TINY), "--json", "--set", f"tracking.mlflow.uri={uri}", root=tmp_path / "out")
    assert result.returncode == 0, result.stderr[-2000:]
    tracking = json.loads(result.stdout)["tracking"]
    assert tracking["uri"] == uri
    run = MlflowClient(tracking_uri=uri).get_run(tracking["mlflow_run_id"])
    assert run.info.status == "FINISHED" and run.data.tags["pipeline.version"] == "v0001"
    assert run.data.metrics["accuracy.onnx-fp32.passed"] == 1.0
    assert run.info.artifact_uri.startswith((tmp_path / "mlartifacts").as_uri())  # beside the database
    assert (tmp_path / "mlartifacts").is_dir() and not (tmp_path / "mlruns").exists()
    # the winner, in MLflow's own model format, loads back through MLflow with the graph's signature
    import mlflow
    import mlflow.onnx

    assert tracking["model"].startswith("winner logged as an MLflow model (onnx")
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    mlflow.set_tracking_uri(uri)
    model_uri = f"runs:/{tracking['mlflow_run_id']}/model"
    graph = mlflow.onnx.load_model(model_uri).graph
    info = mlflow.models.get_model_info(model_uri)
    assert [i["name"] for i in info.signature.inputs.to_dict()] == [v.name for v in graph.input]
    shipped = json.loads((tmp_path / "out" / "tiny" / "v0001" / "winner.json").read_text())["file"]
    import numpy as np
    import onnx
    from onnx import numpy_helper

    signed = onnx.load(str(tmp_path / "out" / "tiny" / "v0001" / shipped)).graph
    assert [n.op_type for n in graph.node] == [n.op_type for n in signed.node]
    weights = {t.name: numpy_helper.to_array(t) for t in signed.initializer}
    assert all(np.array_equal(numpy_helper.to_array(t), weights[t.name]) for t in graph.initializer)
