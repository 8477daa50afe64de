"""A sign-off tells the truth about what was asked for: a variant forced to fail (INT8 of an op the model does
not have) is listed in the sign-off's first section, in manifest.json, in the closing table and in `list`;
`plan` says it is reused as failed; and `variants.allow_failed: false` turns the same run into exit 1."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from pipeline.check.speed import fmt_ms
from tests.integration.test_deploy_cli import TINY, cli

# Whether the winner stabilizes depends on the machine's load, never asserted: the headline then carries this
PROVISIONAL = " (provisional: winner did not stabilize)"


def headline(manifest: dict) -> str:
    """The manifest's headline without the timing-dependent suffix, which must agree with `provisional`."""
    assert manifest["headline"].endswith(PROVISIONAL) == manifest["provisional"], manifest["headline"]
    return manifest["headline"].removesuffix(PROVISIONAL)


FAILING = [
    "--set",
    "variants.build=[torchscript-fp32, onnx-fp32, onnx-int8]",
    "--set",
    "export.int8.op_types=[Conv]",
]


@pytest.fixture(scope="module")
def deployed(tmp_path_factory: pytest.TempPathFactory):
    root = tmp_path_factory.mktemp("truth")
    return root, cli(
        "deploy", str(TINY), *FAILING, "--promote", root=root
    )  # latest: what a failure must keep


def test_the_run_signs_off_and_says_which_variant_failed(deployed) -> None:
    root, result = deployed
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert "signed off, 1 of 3 variants failed" in result.stdout
    table = result.stdout[result.stdout.index("Deploy summary") :]
    assert "onnx-int8" in table and "FAILED (int8)" in table  # the closing table
    assert (
        "✗ onnx-int8 failed at int8: StageError: int8: nothing to quantize: export.int8.op_types is ['Conv']"
        in result.stdout
    )


def test_manifest_and_signoff_page_list_the_failure(deployed) -> None:
    root, _ = deployed
    version = root / "tiny" / "v0001"
    manifest = json.loads((version / "manifest.json").read_text())
    assert manifest["signed_off"] is True and headline(manifest) == "signed off, 1 of 3 variants failed"
    [failure] = manifest["failed"]
    assert failure["artifact"] == "onnx-int8" and failure["stage"] == "int8"
    assert (
        "nothing to quantize: export.int8.op_types is ['Conv']; the graph has 12 MatMul" in failure["error"]
    )
    assert manifest["requested"] == ["torchscript-fp32", "onnx-fp32", "onnx-int8"]
    page = (version / "reports" / "signoff.md").read_text()
    verdict = page[page.index("## Verdict") : page.index("## Winner")]
    assert "1 of 3 requested variants failed." in verdict and "| onnx-int8 | int8 |" in verdict


def test_winner_names_its_file_runtime_and_accuracy_record(deployed) -> None:
    root, _ = deployed
    version = root / "tiny" / "v0001"
    winner = json.loads((version / "winner.json").read_text())
    assert (version / winner["file"]).is_file()
    assert winner["runtime"].endswith("-cpu") and winner["io"] == "host" and winner["cuda_graph"] is False
    accuracy = json.loads((version / "reports" / "accuracy.json").read_text())
    record = accuracy["artifacts"][winner["artifact"]]["runtimes"][winner["accuracy"]["runtime"]]
    assert record["passed"] is True and winner["accuracy"]["passed"] is True
    assert winner["accuracy"]["runtime"] == winner["runtime"]


def test_list_and_plan_show_the_failure(deployed) -> None:
    root, _ = deployed
    listing = cli("list", str(TINY), root=root)
    assert listing.returncode == 0 and "signed off, 1 of 3 variants failed" in listing.stdout
    plan = cli("plan", str(TINY), *FAILING, root=root)
    assert plan.returncode == 0
    line = next(
        line for line in plan.stdout.splitlines() if line.strip().endswith("int8") or " int8 " in line
    )
    assert "fresh (failed: StageError: int8: nothing to quantize: export.int8.op_types is ['Conv']" in line


def test_allow_failed_false_fails_the_same_run(deployed) -> None:
    root, _ = deployed
    result = cli("deploy", str(TINY), *FAILING, "--set", "variants.allow_failed=false", root=root)
    assert result.returncode == 1, result.stdout[-3000:] + result.stderr[-3000:]
    assert "1 of 3 requested variants failed (onnx-int8) and variants.allow_failed is false" in result.stdout
    newest = sorted((root / "tiny").glob("v*"))[-1]
    manifest = json.loads((newest / "manifest.json").read_text())
    assert manifest["signed_off"] is False and not (newest / "winner.json").exists()
    assert (root / "tiny" / "latest").resolve().name == "v0001"


def test_relative_root_and_another_working_directory(tmp_path: Path) -> None:
    """The default recipe shape: a relative output.root and a data file relative to the recipe, run from a
    directory that is neither; the ONNX Runtime tools that change directory must not lose any file."""
    import os
    import subprocess
    import sys

    import numpy as np

    recipes = tmp_path / "project" / "recipes"
    (recipes / "data").mkdir(parents=True)
    rng = np.random.default_rng(0)
    np.savez(
        recipes / "data" / "samples.npz",
        input_ids=rng.integers(1, 999, size=(24, 16)),
        attention_mask=np.ones((24, 16), dtype=np.int64),
    )
    text = TINY.read_text().replace("{source: random, samples: 24}", "{source: npz, path: data/samples.npz}")
    (recipes / "tiny.yaml").write_text(text)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "pipeline",
            "deploy",
            str(recipes / "tiny.yaml"),
            "--set",
            "variants.build=[onnx-fp32, onnx-optimized-fp32, onnx-int8]",
        ],
        cwd=elsewhere,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    version = elsewhere / "artifacts" / "tiny" / "v0001"
    manifest = json.loads((version / "manifest.json").read_text())
    assert manifest["failed"] == [] and headline(manifest) == "signed off"
    assert {a["name"] for a in manifest["artifacts"]} == {"onnx-fp32", "onnx-optimized-fp32", "onnx-int8"}
    int8 = next(a for a in manifest["artifacts"] if a["name"] == "onnx-int8")
    assert "FileNotFoundError" not in int8["details"]["preprocess"]  # the pre-pass found its files
    assert not list(elsewhere.glob("*.onnx")) and not list(elsewhere.glob("*.data"))


@pytest.mark.parametrize("width", [1400, 900])
def test_the_first_screen_decides_in_a_headless_browser(deployed, width: int, tmp_path: Path) -> None:
    """The page as a reader sees it, in Chromium at 1,400 and 900 pixels: the card that decides fits the first
    screen, in green, with the file to ship, its runtime, the winner's p50 and the counts; "Not run" (when there
    is any) comes before the evidence; no identifier or column heading wraps."""
    from tests.browser import first_screen

    root, _ = deployed
    version = root / "tiny" / "v0001"
    winner = json.loads((version / "winner.json").read_text())
    seen = first_screen(version / "reports" / "signoff.html", width, tmp_path / f"first-screen-{width}.png")
    if winner["provisional"]:  # the winner's timing did not settle on a busy machine: amber, never green
        assert seen["state"].startswith("PROVISIONAL") and seen["border"] == "rgb(212, 155, 0)", seen
    else:
        assert seen["state"] == "SIGNED OFF" and seen["border"] == "rgb(46, 157, 79)", seen
    fields = seen["fields"]
    assert fields["ship"] == f"{winner['file']} ({winner['artifact']})"
    assert fields["run it on"].startswith(f"{winner['runtime']} ({winner['io']} I/O")
    assert fields["p50 at batch 1"].startswith(f"{fmt_ms(winner['value'])} ms (95% interval ")
    assert fields["failed"].startswith("1") and "onnx-int8" in fields["failed"] + str(seen["headings"])
    assert re.fullmatch(r"(\d+) of \1 artifact-runtime pairs passed", fields["validated"]), fields
    assert winner["file"] in (seen["snippet"] or "")
    card, view = seen["card"], seen["viewport"]
    assert card["left"] >= 0 and card["right"] <= view["width"] and card["bottom"] <= view["height"], seen
    headings = seen["headings"]
    assert headings[0] == "Verdict"
    if "Not run" in headings:
        assert headings.index("Not run") < headings.index("Accuracy")
    assert seen["wrapped"] == [], seen["wrapped"]
