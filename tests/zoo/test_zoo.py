"""The model zoo, deployed as a user deploys a model nobody here tuned for: `python -m pipeline deploy` on each
recipe in tests/zoo/recipes (family defaults, no workarounds), from an empty working directory.

Each must sign off with every requested variant built and passing, every sentence of its sign-off true
against its numbers (tests/claims.py), nothing left in the working directory, every export made from the
reference's weights, and for a transformer the feed-forward layers kept out of INT8 whatever they are named.
"""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

import pytest

from tests.claims import problems
from tests.warm_cli import run_pipeline

ROOT = Path(__file__).resolve().parents[2]
RECIPES = sorted((ROOT / "tests" / "zoo" / "recipes").glob("*.yaml"))
EXPORTS = ("torchscript-fp32", "onnx-fp32")  # the artifacts exported from the model itself
HOST_ONLY = {"engine", "exported", "aoti"}  # kinds this CPU host does not build or run


CONCURRENT = 2  # deploys at a time: each pins its benchmark to one thread (intra_op_threads in the recipes)


def deploy(recipe: Path, root: Path, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    args = ["deploy", str(recipe), "--set", f"output.root={root}", "--json"]
    return run_pipeline(args, cwd=cwd, env=env, timeout=900)


@pytest.fixture(scope="module")
def zoo(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Future]]:
    """Every recipe's deploy, started at once CONCURRENT at a time (the tests of one model wait for its own)."""
    with ThreadPoolExecutor(CONCURRENT) as pool:
        runs = {}
        for recipe in RECIPES:
            work = tmp_path_factory.mktemp(f"cwd-{recipe.stem}")
            root = tmp_path_factory.mktemp(f"out-{recipe.stem}")
            runs[recipe.stem] = pool.submit(lambda r=recipe, o=root, w=work: (w, deploy(r, o, w)))
        yield runs


@pytest.fixture(params=RECIPES, ids=[r.stem for r in RECIPES])
def deployed(request: pytest.FixtureRequest, zoo: dict[str, Future]):
    recipe: Path = request.param
    work, result = zoo[recipe.stem].result()
    return recipe, work, result


def _version(result: subprocess.CompletedProcess[str]) -> tuple[dict, Path]:
    assert result.returncode == 0, result.stderr[-4000:]
    document = json.loads(result.stdout)
    return document, Path(document["path"])


def test_signs_off_with_every_requested_variant(deployed) -> None:
    recipe, _, result = deployed
    document, version = _version(result)
    assert document["status"] == "signed_off", document
    manifest = json.loads((version / "manifest.json").read_text())
    assert manifest["failed"] == [], manifest["failed"]
    built = {a["name"] for a in manifest["artifacts"]}
    assert set(manifest["requested"]) <= built, (
        f"{recipe.stem}: not built {set(manifest['requested']) - built}"
    )
    accuracy = json.loads((version / "reports" / "accuracy.json").read_text())
    for name in manifest["requested"]:
        assert accuracy["artifacts"][name]["passed"], (name, accuracy["artifacts"][name]["reason"])


def test_every_report_claim_holds(deployed) -> None:
    _, _, result = deployed
    _, version = _version(result)
    assert problems(version) == []


def test_the_sign_off_says_why_the_winner_wins(deployed) -> None:
    """The Profile section names what bounds the winner, in its own profile's figures."""
    _, _, result = deployed
    _, version = _version(result)
    winner = json.loads((version / "winner.json").read_text())
    speed = json.loads((version / "reports/speed.json").read_text())
    row = next(
        r
        for r in speed["results"]
        if (r["artifact"], r["runtime"], r["io"]) == (winner["artifact"], winner["runtime"], winner["io"])
        and r["shapes"] == winner["shapes"]
    )
    assert "split" in row.get("profile", {}), f"the winner was not profiled: {row.get('profile')}"
    text = (version / "reports/signoff.md").read_text()
    section = text[text.index("## Profile") :].split("\n## ")[0]
    assert f"**The winner is {row['profile']['bound']}:" in section
    assert row["profile"]["top"][0]["name"] in section


def test_nothing_is_left_in_the_working_directory(deployed) -> None:
    _, work, result = deployed
    _version(result)
    assert sorted(p.name for p in work.iterdir()) == []


def test_every_export_is_of_the_reference_weights(deployed) -> None:
    _, _, result = deployed
    _, version = _version(result)
    manifest = json.loads((version / "manifest.json").read_text())
    digests = {a["name"]: a["details"].get("weights") for a in manifest["artifacts"] if a["name"] in EXPORTS}
    assert digests and len(set(digests.values())) == 1 and None not in digests.values(), digests


def test_transformers_keep_their_feed_forward_layers_in_float(deployed) -> None:
    recipe, _, result = deployed
    _, version = _version(result)
    manifest = json.loads((version / "manifest.json").read_text())
    family = manifest["recipe"]["model"].get("family")
    int8 = next((a for a in manifest["artifacts"] if a["name"] == "onnx-int8"), None)
    if int8 is None or family != "transformer":
        pytest.skip(f"{recipe.stem}: no static INT8 of a transformer")
    kept = int8["details"]["kept_float_feed_forward"]
    assert kept and len(kept) % 2 == 0, kept  # two linears per block
    assert not set(kept) & set(int8["details"]["quantized_nodes"])


def test_the_report_states_what_each_input_covered(deployed) -> None:
    _, _, result = deployed
    _, version = _version(result)
    manifest = json.loads((version / "manifest.json").read_text())
    accuracy = json.loads((version / "reports" / "accuracy.json").read_text())
    for spec in manifest["recipe"]["inputs"]:
        covered = accuracy["inputs"][spec["name"]]
        low, high = spec.get("low"), spec.get("high")
        if low is not None:  # the shape corners zero-pad samples to the max shape: 0 may join the range
            assert min(low, 0) <= covered["min"] and covered["max"] <= high, (spec, covered)
        if low != high:
            assert covered["distinct"] >= 2, (spec, covered)
    page = (version / "reports" / "signoff.md").read_text()
    assert "## Inputs" in page


def test_the_onnx_export_restates_no_initializer(deployed) -> None:
    """value_info entries for initializers made ONNX Runtime 1.31's dynamic quantizer fail on every Gemm model
    of the GPU zoo ("Inferred shape and existing shape differ"): the export leaves them out."""
    import onnx

    _, _, result = deployed
    _, version = _version(result)
    model = onnx.load(str(version / "model.onnx"))
    initializers = {i.name for i in model.graph.initializer}
    assert not [v.name for v in model.graph.value_info if v.name in initializers]
