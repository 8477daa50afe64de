"""An ONNX graph is kept only where it runs at the recipe's smallest and largest shapes, whichever exporter made
it: a model whose loop both exporters unroll at the traced length fails its export once, with both reasons,
instead of every graph made from it failing again downstream; dynamo's reason names the dim its graph fixed."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

from tests.integration.test_deploy_cli import TINY, cli
from tests.reliability.conftest import sets


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


def _deploy(
    tmp_path: Path, recipe: Path, *overrides: str, code: int = 0, env: dict[str, str] | None = None
) -> tuple[subprocess.CompletedProcess[str], Path, dict[str, Any]]:
    """The recipe deployed into tmp_path/out with these overrides, once it exits with `code`: the command, its
    version folder and the version's manifest."""
    done = cli("deploy", str(recipe), *sets(*overrides), root=tmp_path / "out", env=env)
    assert done.returncode == code, done.stdout[-3000:] + done.stderr[-3000:]
    [version] = (tmp_path / "out" / "tiny").glob("v*")
    return done, version, json.loads((version / "manifest.json").read_text())


def test_a_graph_neither_exporter_can_make_fails_the_export_with_both_reasons(tmp_path: Path) -> None:
    recipe = _recipe(tmp_path, "stepwise", "state")
    _, _, manifest = _deploy(tmp_path, recipe, "variants.build=[onnx-fp32, onnx-int8-dynamic]", code=1)
    failed = manifest["failed"]
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
    done, _, manifest = _deploy(
        tmp_path,
        _recipe(tmp_path, "unexportable", "pooled"),
        "variants.build=[onnx-fp32]",
        code=1,
        env={"PIPELINE_ONNX_LANE": "0"},  # in this process: a lane's worker would keep its output to itself
    )
    failed = manifest["failed"]
    error = next(f["error"] for f in failed if (f["artifact"], f["stage"]) == ("onnx-fp32", "export_onnx"))
    assert error.startswith("StageError: onnx: neither exporter gave a graph: dynamo: "), error
    assert "; legacy: UnsupportedOperatorError: Exporting the operator 'aten::histc'" in error, error
    assert "Torch IR graph" not in done.stdout + done.stderr


def test_the_advice_works_a_dim_fixed_by_min_equal_to_max_exports_with_dynamo(tmp_path: Path) -> None:
    """The failure above says to declare the dim fixed; `min` equal to `max` under dims is how, and torch refuses
    a symbolic dim of one value ("Cannot create Dim with inconsistent min=16, max=16"): the dynamo export failed
    and the deploy fell back to the legacy exporter without a word (a hold-out Mamba's legacy graph then failed
    as well). Such a dim is now static in every export, a fixed batch of 1 included (the example is not widened
    to 2), and the held-out split is validated in batches of that size (the recipe's data_batch is 4)."""
    _, _, manifest = _deploy(
        tmp_path,
        _recipe(tmp_path, "stepwise", "state"),
        "variants.build=[onnx-fp32]",
        "dims.sequence={min: 16, opt: 16, max: 16}",
        "dims.batch={min: 1, opt: 1, max: 1}",
        "validation.corner_batches={min: 1, opt: 1, max: 1}",
        "benchmark.batch_sizes=[1]",
    )
    [onnx] = [a for a in manifest["artifacts"] if a["name"] == "onnx-fp32"]
    assert onnx["details"]["exporter"] == "dynamo", onnx["details"]
    assert "fallback_reason" not in onnx["details"], onnx["details"]
    assert not [w for w in manifest["warnings"] if "exporter" in w], manifest["warnings"]


def test_a_fallback_to_the_legacy_exporter_is_a_warning_with_dynamos_reason(tmp_path: Path) -> None:
    """The graph is validated like any other, but the recipe's exporter did not make it: the manifest's details
    said so and the sign-off did not."""
    _, version, manifest = _deploy(
        tmp_path, _recipe(tmp_path, "value_branch", "pooled"), "variants.build=[onnx-fp32]"
    )
    [onnx] = [a for a in manifest["artifacts"] if a["name"] == "onnx-fp32"]
    assert onnx["details"]["exporter"] == "legacy", onnx["details"]
    [warning] = [w for w in manifest["warnings"] if "legacy" in w]
    assert "exported with the legacy (TorchScript-based) exporter, as the dynamo export failed: " in warning
    assert onnx["details"]["fallback_reason"] in warning
    assert (
        "exported with the legacy (TorchScript-based) exporter"
        in (version / "reports/signoff.md").read_text()
    )


def test_a_fixed_batch_of_four_signs_off_with_int8_and_the_optimized_graph(tmp_path: Path) -> None:
    """A hold-out with its batch fixed at 4 (min = max) and no corner batches of its own: the recipe was
    refused for the default corner batches (2, 2, 1) the user never wrote; INT8 calibration fed its static graph
    batches of 8 ("Got: 8 Expected: 4"), and the optimizer checked its graphs at a batch of 2. Each now takes
    batches within the range, and the TorchScript trace, taken at a batch of 2, a batch within it (the model
    runs on batches of 4 only)."""
    recipe = _recipe(tmp_path, "batch_of_four", "pooled")
    text = recipe.read_text()
    recipe.write_text("\n".join(line for line in text.splitlines() if "corner_batches" not in line) + "\n")
    _, version, manifest = _deploy(
        tmp_path,
        recipe,
        "variants.build=[torchscript-fp32, onnx-fp32, onnx-int8, onnx-optimized-fp32]",
        "dims.batch={min: 4, opt: 4, max: 4}",
        "benchmark.batch_sizes=[4]",
        "selection.objective.batch=4",
    )
    assert manifest["failed"] == [], manifest["failed"]
    assert manifest["recipe"]["validation"]["corner_batches"] == {"min": 4, "opt": 4, "max": 4}
    accuracy = json.loads((version / "reports/accuracy.json").read_text())
    for name in ("torchscript-fp32", "onnx-fp32", "onnx-int8", "onnx-optimized-fp32"):
        assert accuracy["artifacts"][name]["passed"], (name, accuracy["artifacts"][name]["reason"])


def test_an_artifact_is_validated_at_the_largest_batch_it_is_timed_at(tmp_path: Path) -> None:
    """A model that branches on its batch size (past 4): the exports trace the branch of a small batch, and
    every corner and held-out batch is of 1 or 2, so all agreed; the benchmark timed them at 6. Validation now
    runs that batch too (input set 'timed'), where both fail, and says the range's max (8) is not validated."""
    recipe = _recipe(tmp_path, "large_batch_branch", "pooled")
    _, version, manifest = _deploy(
        tmp_path,
        recipe,
        "variants.build=[torchscript-fp32, onnx-fp32]",
        "export.onnx={exporter: legacy}",
        "benchmark.batch_sizes=[1, 6]",
        code=1,
    )
    accuracy = json.loads((version / "reports/accuracy.json").read_text())
    for name in ("torchscript-fp32", "onnx-fp32"):
        entry = accuracy["artifacts"][name]
        failing = {c["inputs"] for c in entry["checks"] if not c["passed"] and not c["informational"]}
        assert failing == {"timed"}, (name, entry["reason"])
    timed = [c for c in accuracy["artifacts"]["onnx-fp32"]["checks"] if c["inputs"] == "timed"]
    assert timed and accuracy["inputs"]["input_ids"]["dim_ranges"][0] == [1, 6]
    assert any(
        w.startswith("dims.batch.max (8) is not validated: the largest batch validated is 6")
        for w in accuracy["warnings"]
    )
    page = (version / "reports/signoff.md").read_text()
    assert "the largest batch the benchmark times (timed)" in page
