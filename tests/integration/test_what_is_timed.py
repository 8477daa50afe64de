"""What a deploy times and how it says so, on real small exports: an FP16 graph with an accumulating scatter
runs on ONNX Runtime (kept in float32, as ONNX Runtime's CPU provider has no float16 kernel for it), and an
artifact whose runtimes `benchmark.runtimes` leaves out is "not timed", not "not runnable on this host"."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.integration.test_deploy_cli import TINY, cli

SCATTER = """
name: scatter
model: {source: entrypoint, entrypoint: "tests.models.tiny:scatter", seed: 0}
inputs:
  - {name: x, dtype: float32, shape: [batch, 8]}
  - {name: bucket, dtype: int64, shape: [batch, 8], low: 0, high: 5}
dims:
  batch: {min: 1, opt: 2, max: 4}
outputs: [hidden, counts]
data:
  samples: {source: random, samples: 16}
  calibration: 8
  validation: 8
variants:
  build: [onnx-fp32, onnx-fp16, onnx-optimized-fp16]
  required: [onnx-fp32]
benchmark:
  batch_sizes: [1, 2]
  warmup_s: 0.05
  min_s: 0.1
  window_s: 0.05
  max_s: 0.3
selection:
  objective: {metric: p50_ms, batch: 1}
"""


def _read(path: Path) -> dict:
    return json.loads(path.read_text())


def test_an_fp16_graph_keeps_its_accumulating_scatter_in_fp32_and_runs(tmp_path: Path) -> None:
    """Before, ONNX Runtime loaded the FP16 graph and failed every call ("MLFloat16 data type is not supported
    with ScatterElements opset 16 when reduction is 'add'"), then the benchmark tried it again at each batch;
    the optimized FP16 graph failed its stage on it."""
    recipe = tmp_path / "scatter.yaml"
    recipe.write_text(SCATTER)
    result = cli("deploy", str(recipe), root=tmp_path / "out")
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    version = tmp_path / "out/scatter/v0001"
    accuracy = _read(version / "reports/accuracy.json")["artifacts"]
    stages = {s["name"]: s for s in _read(version / "stages.json")["stages"]}
    speed = _read(version / "reports/speed.json")
    assert speed["failed"] == []
    # both FP16 conversions, the plain copy's and the optimized graph's (a hold-out GNN's failed there)
    for artifact, stage in (("onnx-fp16", "fp16"), ("onnx-optimized-fp16", "optimize_onnx_fp16")):
        assert accuracy[artifact]["passed"], accuracy[artifact]["reason"]
        assert stages[stage]["details"]["reducing_scatters_in_fp32"], stages[stage]["details"]
        assert {r["batch"] for r in speed["results"] if r["artifact"] == artifact} == {1, 2}


@pytest.fixture(scope="module")
def unlisted(tmp_path_factory: pytest.TempPathFactory):
    root = tmp_path_factory.mktemp("out")
    result = cli("deploy", str(TINY), "--set", "benchmark.runtimes=[onnxruntime-cpu]", root=root)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    return root / "tiny/v0001", result


def test_an_artifact_the_recipe_leaves_untimed_is_not_called_unrunnable(unlisted) -> None:
    version, result = unlisted
    assert "not runnable" not in result.stdout
    table = result.stdout.split("Deploy summary", 1)[1].split("winner:", 1)[0]
    notes = " ".join(line.rsplit("│", 2)[-2].strip() for line in table.splitlines() if line.count("│") > 2)
    assert "not timed: benchmark.runtimes lists none of its runtimes (torchscript-cpu)" in notes, table
    assert _read(version / "reports/accuracy.json")["not_run"] == []
    assert _read(version / "reports/speed.json")["not_run"] == []
    signoff = (version / "reports/signoff.md").read_text()
    assert "not runnable on this host" not in signoff and "## Not run" not in signoff
    assert "| not run here | 0 |" in signoff
    assert (
        "| torchscript-fp32 | torchscript-cpu | any | benchmark.runtimes lists none of its runtimes"
        in signoff
    )


def test_compare_of_two_recipes_versions_says_they_are_different_models(unlisted, tmp_path: Path) -> None:
    """Two real versions of two recipes (tiny and scatter): compared as asked, with the same exit codes, but
    the first line says they are different models, and --json has same_model false."""
    version, _ = unlisted
    recipe = tmp_path / "scatter.yaml"
    recipe.write_text(SCATTER)
    other = cli("deploy", str(recipe), root=version.parents[1])
    assert other.returncode == 0, other.stdout[-3000:] + other.stderr[-3000:]
    scatter = version.parents[1] / "scatter/v0001"
    shown = cli("compare", str(version), str(scatter))
    assert shown.returncode in (0, 1), shown.stderr  # 1 only for a regression beyond the budget
    assert shown.stdout.splitlines()[0].startswith("different models: A is tiny, B is scatter"), shown.stdout
    as_json = cli("compare", str(version), str(scatter), "--json")
    report = json.loads(as_json.stdout)
    assert report["same_model"] is False and report["exit_code"] == as_json.returncode == shown.returncode
    same = cli("compare", str(version), str(version))
    assert same.returncode == 0 and "different models" not in same.stdout
