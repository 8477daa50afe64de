"""An ONNX graph is kept only where it runs at the recipe's smallest and largest shapes, whichever exporter made
it: a model whose loop both exporters unroll at the traced length fails its export once, with both reasons,
instead of every graph made from it failing again downstream; dynamo's reason names the dim its graph fixed."""

from __future__ import annotations

import json
from pathlib import Path

from tests.integration.test_deploy_cli import TINY, cli


def _recipe(tmp_path: Path, factory: str, output: str) -> Path:
    recipe = tmp_path / f"{factory}.yaml"
    text = TINY.read_text().replace(
        '{source: entrypoint, entrypoint: "tests.models.tiny:encoder", kwargs: {hidden: 64, layers: 2}, seed: 0, '
        "family: transformer}",
        f'{{source: entrypoint, entrypoint: "tests.reliability.bad_models:{factory}", seed: 0}}',
    )
    text = text.replace("onnx: {exporter: legacy}", "onnx: {exporter: dynamo}")  # the default, falling back
    recipe.write_text(text.replace("outputs: [hidden, pooled]", f"outputs: [{output}]"))
    return recipe


def test_a_graph_neither_exporter_can_make_fails_the_export_with_both_reasons(tmp_path: Path) -> None:
    recipe = _recipe(tmp_path, "stepwise", "state")
    done = cli(
        "deploy", str(recipe), "--set", "variants.build=[onnx-fp32, onnx-int8-dynamic]", root=tmp_path / "out"
    )
    assert done.returncode == 1, done.stdout[-2000:] + done.stderr[-2000:]
    [version] = (tmp_path / "out" / "tiny").glob("v*")
    failed = json.loads((version / "manifest.json").read_text())["failed"]
    assert [(f["artifact"], f["stage"]) for f in failed][0] == ("onnx-fp32", "export_onnx"), failed
    error = failed[0]["error"]
    assert "neither exporter gave a graph that runs at the recipe's shapes: dynamo: " in error
    assert "; legacy: at the min, max or opt shape: " in error
    # dynamo's reason names the dim its graph fixed, and why, from the graph itself
    dynamo = error.split("; legacy: ")[0]
    assert (
        "the graph fixes 'sequence' (4..32 in the recipe) at 16 on input_ids axis 1, attention_mask axis 1"
        in dynamo
    ), error
    assert "torch.export found the model needs that size" in dynamo, error
    # the runtime's whole reason for the legacy graph, not its first line
    assert "Status Message: indices element out of data bounds" in error.split("; legacy: ")[1], error
    # the graphs built from it are not built at all: one failure, not one per conversion
    assert all(f["stage"] == "export_onnx" for f in failed if f["artifact"] == "onnx-fp32")


def test_a_model_neither_exporter_can_trace_says_both_reasons_and_prints_no_graph(tmp_path: Path) -> None:
    """The fallback exporter raising (not making a graph that fails to run) still gives dynamo's reason, and
    the TorchScript graph torch logs when it fails goes to the stage's log, not the console."""
    done = cli(
        "deploy",
        str(_recipe(tmp_path, "unexportable", "pooled")),
        "--set",
        "variants.build=[onnx-fp32]",
        root=tmp_path / "out",
        env={"PIPELINE_ONNX_LANE": "0"},  # in this process: a lane's worker would keep its output to itself
    )
    assert done.returncode == 1, done.stdout[-2000:] + done.stderr[-2000:]
    [version] = (tmp_path / "out" / "tiny").glob("v*")
    failed = json.loads((version / "manifest.json").read_text())["failed"]
    error = next(f["error"] for f in failed if (f["artifact"], f["stage"]) == ("onnx-fp32", "export_onnx"))
    assert error.startswith("StageError: onnx: neither exporter gave a graph: dynamo: "), error
    assert "; legacy: UnsupportedOperatorError: Exporting the operator 'aten::histc'" in error, error
    assert "Torch IR graph" not in done.stdout + done.stderr
