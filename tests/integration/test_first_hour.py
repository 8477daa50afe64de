"""A new user's first hour, followed literally from the README in a fresh working directory: the quickstart on
the tiny recipe, loading and calling the winner, a custom CNN recipe, a second version with a Triton
repository and `compare`; then what CI relies on: --json documents, the regression gate, reproduce.sh from
elsewhere, and the MLflow run record."""

from __future__ import annotations

import importlib.util
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import pytest

ROOT = Path(__file__).resolve().parents[2]
README = (ROOT / "README.md").read_text()
SNIPPETS = {
    name: code for name, code in re.findall(r"<!-- test: ([\w-]+) -->\n```\w+\n(.*?)```", README, flags=re.S)
}
STAMP = r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d"
HAS_MLFLOW = importlib.util.find_spec("mlflow") is not None


@pytest.fixture(scope="module")
def clone(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A working directory laid out like a checkout (the code, recipes and tests), with `python` on PATH."""
    work = tmp_path_factory.mktemp("clone")
    for name in ("pipeline", "recipes", "tests"):
        (work / name).symlink_to(ROOT / name)
    bin_dir = work / ".bin"
    bin_dir.mkdir()
    wrapper = bin_dir / "python"
    wrapper.write_text(f'#!/bin/sh\nexec {sys.executable} "$@"\n')
    wrapper.chmod(0o755)
    return work


def shell(clone: Path, script: str, cwd: Path | None = None, **env: str) -> subprocess.CompletedProcess[str]:
    environment = {**os.environ, "PATH": f"{clone / '.bin'}:{os.environ['PATH']}", **env}
    return subprocess.run(
        ["bash", "-eo", "pipefail", "-c", script],
        cwd=cwd or clone,
        env=environment,
        capture_output=True,
        text=True,
        timeout=900,
    )


def pipeline_json(clone: Path, *args: str) -> tuple[int, dict[str, Any]]:
    out = shell(clone, "python -m pipeline " + " ".join(args) + " --json")
    return out.returncode, json.loads(out.stdout)  # exactly one document, or this raises


def _read(path: Path) -> dict[str, Any]:
    return json.loads(path.read_text())


# ---------------------------------------------------------------- the README, literally


@pytest.fixture(scope="module")
def quickstart(clone: Path) -> subprocess.CompletedProcess[str]:
    return shell(clone, SNIPPETS["quickstart"])


def test_quickstart_signs_off_with_readable_progress(clone: Path, quickstart) -> None:
    assert quickstart.returncode == 0, quickstart.stderr[-3000:]
    manifest = _read(clone / "artifacts/tiny/v0001/manifest.json")
    assert manifest["signed_off"] is True
    # progress on stderr, the result on stdout: `deploy | tee` keeps what was decided
    assert re.search(rf"^{STAMP} \[2/6\]  +ran export_onnx .* total 0:\d\d:\d\d", quickstart.stderr, re.M)
    assert not re.search(rf"^{STAMP} \[", quickstart.stdout, re.M)
    # a busy host may leave the winner unsettled: still signed off, said so on the same line
    assert re.search(r"^signed off( \(provisional: [^)]*\))?: .*tiny/v0001$", quickstart.stdout, re.M)
    assert re.search(r"^v0001 .* signed off .* winner \S+ \(latest\)$", quickstart.stdout, re.M)


def test_load_winner_snippet(clone: Path, quickstart) -> None:
    out = shell(clone, f"python - <<'EOF'\n{SNIPPETS['load-winner']}EOF")
    assert out.returncode == 0, out.stderr[-3000:]
    winner = _read(clone / "artifacts/tiny/latest/winner.json")["artifact"]
    assert out.stdout.strip() == f"{winner} -> (1, 64)"


def test_readme_cnn_recipe_is_the_shipped_one_and_its_data_what_the_script_makes() -> None:
    from recipes.examples.cnn.make_images import images

    assert SNIPPETS["cnn-recipe"] == (ROOT / "recipes/examples/cnn/cnn.yaml").read_text()
    with np.load(ROOT / "recipes/examples/cnn/images.npz") as shipped:
        assert shipped.files == ["images"] and np.allclose(shipped["images"], images(), atol=1e-6)


def test_custom_cnn_recipe_deploys_and_quantizes_its_convs(clone: Path) -> None:
    out = shell(clone, SNIPPETS["cnn-deploy"])
    assert out.returncode == 0, out.stderr[-3000:]
    version = clone / "artifacts/cnn/v0001"
    artifacts = {a["name"] for a in _read(version / "manifest.json")["artifacts"]}
    assert artifacts == {"onnx-fp32", "onnx-int8"}
    int8 = next(s for s in _read(version / "stages.json")["stages"] if s["name"] == "int8")
    # model.py: 0 Conv, 1 BatchNorm (folded into 0), 4 Conv, 5 BatchNorm (folded into 4), 9 Linear
    assert sorted(int8["details"]["quantized_nodes"]) == ["inner.0", "inner.4", "inner.9"]


@pytest.fixture(scope="module")
def second(clone: Path, quickstart) -> subprocess.CompletedProcess[str]:
    return shell(clone, SNIPPETS["compare"])


def test_compare_snippet(clone: Path, second) -> None:
    assert second.returncode == 0, second.stderr[-3000:]
    assert "a new version" in second.stdout  # only the sign-off changed: every stage reused
    assert (clone / "artifacts/tiny/v0002/triton/tiny/config.pbtxt").is_file()
    assert "no regression beyond the budget" in second.stdout


def test_compare_json_verdicts_are_interval_aware(clone: Path, second) -> None:
    code, report = pipeline_json(clone, "compare", "tiny/v0001", "tiny/v0002")
    assert code == 0 and report["exit_code"] == 0 and report["regressions"] == []
    assert report["speed"] and report["environment"] == []
    for row in report["speed"]:  # the same reused measurements: every interval overlaps itself
        assert row["a"] == row["b"] and row["a_ci95"] == row["b_ci95"] and row["verdict"] == "within noise"
    assert report["recipe"] == [{"key": "export.triton", "a": "false", "b": "true"}]


# ---------------------------------------------------------------- serving hand-off


def _model_config_pb2():
    """tritonclient's ModelConfig protobuf, loaded from its generated module (the grpc client is not needed)."""
    spec = importlib.util.find_spec("tritonclient")
    if spec is None or not spec.submodule_search_locations:
        pytest.skip("tritonclient is not installed: pip install 'deploy-pipeline[triton]'")
    path = Path(next(iter(spec.submodule_search_locations))) / "grpc" / "model_config_pb2.py"
    module_spec = importlib.util.spec_from_file_location("triton_model_config_pb2", path)
    module = importlib.util.module_from_spec(module_spec)
    module_spec.loader.exec_module(module)
    return module


def test_triton_config_matches_the_onnx_signature(clone: Path, second) -> None:
    from google.protobuf import text_format

    pb2 = _model_config_pb2()
    version = clone / "artifacts/tiny/v0002"
    repo = version / "triton/tiny"
    config = text_format.Parse((repo / "config.pbtxt").read_text(), pb2.ModelConfig())
    winner = _read(version / "winner.json")
    manifest = _read(version / "manifest.json")
    entry = next(a for a in manifest["artifacts"] if a["name"] == winner["artifact"])
    served = next(repo.glob("2/model.*"))  # the version folder is the release number
    assert served.read_bytes() == (version / entry["path"]).read_bytes()
    graph = onnx.load(str(version / "model.onnx")).graph  # the signature every tiny artifact shares
    assert config.name == "tiny" and config.max_batch_size == 8  # dims.batch.max
    assert config.platform == {"onnx": "onnxruntime_onnx", "torchscript": "pytorch_libtorch"}[entry["kind"]]
    dtype = {onnx.TensorProto.INT64: pb2.TYPE_INT64, onnx.TensorProto.FLOAT: pb2.TYPE_FP32}
    for tensors, values in ((config.input, graph.input), (config.output, graph.output)):
        assert len(tensors) == len(values)
        for tensor, value in zip(tensors, values, strict=True):
            dims = [d.dim_value or -1 for d in value.type.tensor_type.shape.dim]
            assert dims[0] == -1 and list(tensor.dims) == dims[1:]  # batch axis stripped
            assert tensor.data_type == dtype[value.type.tensor_type.elem_type]
            if config.platform == "onnxruntime_onnx":
                assert tensor.name == value.name
    batches = {r["batch"] for r in _read(version / "reports/speed.json")["results"]}
    assert set(config.dynamic_batching.preferred_batch_size) <= batches - {1}
    assert config.dynamic_batching.max_queue_delay_microseconds == 0  # export.triton_queue_delay_us default
    (warmup,) = config.model_warmup
    assert warmup.batch_size == 1 and set(warmup.inputs) == {t.name for t in config.input}
    assert all(list(v.dims) == [16] and v.zero_data for v in warmup.inputs.values())  # dims.sequence.opt
    if config.platform == "pytorch_libtorch":  # Triton's INPUT__i names, mapped to the recipe's
        names = _read(repo / "names.json")
        assert list(names["inputs"].values()) == [i.name for i in graph.input]
    assert [g.kind for g in config.instance_group] == [pb2.ModelInstanceGroup.KIND_CPU]
    listed = {f["path"] for f in manifest["files"]}
    assert {"triton/tiny/config.pbtxt", f"triton/tiny/2/{served.name}"} <= listed


# ---------------------------------------------------------------- what CI relies on


def test_reproduce_script_runs_from_anywhere(clone: Path, second, tmp_path: Path) -> None:
    latest = (clone / "artifacts/tiny/latest").resolve()
    script = (latest / "reproduce.sh").read_text()
    # what the deploy ran with is recorded (an entrypoint may import only through them), as fallbacks only:
    # the defaults are relative, so that a moved store or checkout still re-runs
    recorded = [line for line in script.splitlines() if line.startswith("DEPLOYED_")]
    assert recorded[:2] == [
        f"DEPLOYED_PYTHON={shlex.quote(sys.executable)}",
        f"DEPLOYED_CWD={shlex.quote(str(clone))}",
    ]
    assert recorded[2].startswith("DEPLOYED_PYTHONPATH=")
    rest = "\n".join(line for line in script.splitlines() if not line.startswith("DEPLOYED_"))
    assert str(clone) not in rest and sys.executable not in rest
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    out = shell(clone, f"sh {latest / 'reproduce.sh'}", cwd=elsewhere, PYTHON=sys.executable)
    assert out.returncode == 0 and out.stdout.strip().endswith(f"up to date: tiny/{latest.name}"), out.stderr
    copy = tmp_path / "copied-store"
    shutil.copytree(clone / "artifacts", copy, symlinks=True)
    moved = copy / "tiny" / latest.name / "reproduce.sh"
    out = shell(clone, f"sh {moved}", cwd=elsewhere, PYTHON=sys.executable, REPO=str(clone))
    assert out.returncode == 0 and out.stdout.strip().endswith(f"up to date: tiny/{latest.name}"), out.stderr
    assert sorted(p.name for p in (copy / "tiny").glob("v*")) == sorted(
        p.name for p in (clone / "artifacts/tiny").glob("v*")
    )


def test_json_documents_of_list_plan_validate(clone: Path, second, tmp_path: Path) -> None:
    code, listed = pipeline_json(clone, "list", "tests/recipes/tiny.yaml")
    assert code == 0 and listed["latest"] == "v0002"
    assert [v["version"] for v in listed["versions"]][:2] == ["v0001", "v0002"]
    code, plan = pipeline_json(clone, "plan", "tests/recipes/tiny.yaml", "--set", "export.triton=true")
    assert code == 0 and plan["stages"] and all(s["fresh"] for s in plan["stages"])
    code, valid = pipeline_json(clone, "validate", "recipes/examples/cnn/cnn.yaml")
    assert code == 0 and valid["resolved"]["export"]["int8"]["exclude"] == []
    code, bad = pipeline_json(
        clone, "validate", "tests/recipes/tiny.yaml", "--set", "benchmark.batch_sizes=[0]"
    )
    assert code == 2 and bad["exit_code"] == 2 and "benchmark.batch_sizes[0]" in bad["errors"][0]
    (problem,) = bad["problems"]  # the same error, located for a program
    assert problem["key"] == "benchmark.batch_sizes[0]" and problem["override"] == "benchmark.batch_sizes=[0]"
    assert problem["file"] is None and problem["message"].startswith("must be a positive integer")
    empty = shell(clone, f"python -m pipeline list tests/recipes/tiny.yaml --set output.root={tmp_path}")
    assert empty.returncode == 0 and "no versions yet" in empty.stdout


def test_version_and_did_you_mean(clone: Path) -> None:
    version = shell(clone, "python -m pipeline --version")
    assert version.returncode == 0 and re.fullmatch(r"deploy-pipeline \d+\.\d+\.\d+\n", version.stdout)
    typo = shell(clone, "python -m pipeline deplyo tests/recipes/tiny.yaml")
    assert typo.returncode == 2 and "unknown command 'deplyo'; did you mean 'deploy'?" in typo.stderr


@pytest.fixture(scope="module")
def gated(clone: Path, second) -> dict[str, Any]:
    """v0003: the winner's tolerance tightened so that a check uses 60 % of it (still passing); v0004: a
    tolerance nothing meets (sign-off fails). With mlflow installed, v0003 is also tracked."""
    accuracy = _read(clone / "artifacts/tiny/v0002/reports/accuracy.json")["artifacts"]["onnx-fp32"]
    # the check that uses most of its tolerance (thresholds are the tolerance times the output's scale)
    worst = max(
        (c for c in accuracy["checks"] if c["metric"] == "max_abs"), key=lambda c: c["value"] / c["threshold"]
    )
    assert worst["value"] > 0
    tolerance = worst["value"] / 0.6 / worst.get("scale", 1.0)
    tight = (
        f"{{max_abs: 1.0e-3, cosine: 0.9999, outputs: {{{worst['output']}: {{max_abs: {tolerance:.6e}}}}}}}"
    )
    args = ["deploy", "tests/recipes/tiny.yaml", "--set", f"'validation.tolerances.fp32={tight}'"]
    args += ["--set", "'selection.runtimes=[onnxruntime-cpu]'"]  # onnx-fp32 ships
    if HAS_MLFLOW:
        args += ["--set", f"tracking.mlflow.uri={clone / 'mlruns'}"]
    code, tightened = pipeline_json(clone, *args)
    failing = ["deploy", "tests/recipes/tiny.yaml", "--set", "validation.tolerances.fp32.max_abs=1e-15"]
    return {"tightened": (code, tightened), "failing": pipeline_json(clone, *failing), "check": worst}


def test_compare_gates_on_what_b_ships(clone: Path, gated: dict[str, Any]) -> None:
    code, doc = gated["tightened"]
    assert code == 0 and doc["status"] == "signed_off" and doc["version"] == "v0003"
    assert (
        doc["winner"]["artifact"] == "onnx-fp32"
        and [s["status"] for s in doc["stages"]][:2] == ["reused"] * 2
    )
    code, report = pipeline_json(clone, "compare", "tiny/v0002", "tiny/v0003")
    check = gated["check"]
    assert code == 1 and report["exit_code"] == 1
    assert any(
        r.startswith(f"onnx-fp32 {check['output']}/") and "max_abs uses 60% of its tolerance" in r
        for r in report["regressions"]
    ), report["regressions"]
    code, failing = gated["failing"]
    assert code == 1 and failing["status"] == "not_signed_off"
    code, report = pipeline_json(clone, "compare", "tiny/v0003", failing["path"])
    assert code == 1 and report["regressions"] == ["B (v0004) did not sign off; A (v0003) did"]


@pytest.mark.skipif(not HAS_MLFLOW, reason="mlflow is not installed: pip install 'deploy-pipeline[mlflow]'")
def test_deploy_logs_an_mlflow_run(
    clone: Path, gated: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    from mlflow import MlflowClient

    code, doc = gated["tightened"]
    tracking = doc["tracking"]
    assert code == 0 and tracking["experiment"] == "tiny"
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")
    client = MlflowClient(tracking_uri=tracking["uri"])
    run = client.get_run(tracking["mlflow_run_id"])
    assert run.info.status == "FINISHED"
    assert run.data.tags["pipeline.version"] == "v0003" and run.data.tags["pipeline.winner"] == "onnx-fp32"
    assert run.data.params["benchmark.batch_sizes"] == "[1, 2]"
    assert run.data.metrics["accuracy.onnx-fp32.passed"] == 1.0
    assert any(k.startswith("latency.onnx-fp32.onnxruntime-cpu.host.b1") for k in run.data.metrics)
    logged = {f.path for f in client.list_artifacts(run.info.run_id)}
    assert {"reports", "winner.json", "manifest.json", "recipe.yaml"} <= logged
