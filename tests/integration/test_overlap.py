"""The ONNX builds in the background (a GPU host's plan, forced here on the CPU): the real export and FP16
conversion of the tiny encoder run in child processes on a lane of their own while the TorchScript export runs
in front, validation takes the graphs late, and every file is the one the in-process plan makes."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

from pipeline.executor import Executor
from pipeline.plan import ONNX_BUILDS, plan_stages
from pipeline.recipe_loader import load
from pipeline.stage_child import ChildRun
from pipeline.stages.base import RunContext
from pipeline.store import Store

RECIPE = Path(__file__).resolve().parents[1] / "recipes" / "tiny.yaml"
VARIANTS = "variants.build=[torchscript-fp32, onnx-fp32, onnx-fp16]"
KEEP = {"export_torchscript", "export_onnx", "fp16", "validate"}


def _deploy(root: Path, overlap: bool) -> tuple[dict, Path]:
    recipe = load(RECIPE, [VARIANTS]).recipe
    stages = [s for s in plan_stages(recipe, RECIPE.parent, overlap=overlap) if s.name in KEEP]
    store = Store(root, "tiny")
    work = store.new_work_dir()
    records = Executor(stages, store, []).run(RunContext(work), False, lambda s, w: None, lambda r: None)
    return {r.name: r for r in records}, work


@pytest.fixture(scope="module")
def deploys(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict, Path, dict, Path]:
    behind, behind_dir = _deploy(tmp_path_factory.mktemp("behind"), overlap=True)
    front, front_dir = _deploy(tmp_path_factory.mktemp("front"), overlap=False)
    return behind, behind_dir, front, front_dir


def test_the_onnx_builds_come_first_and_run_in_a_child_on_their_own_lane() -> None:
    recipe = load(RECIPE, [VARIANTS]).recipe
    stages = plan_stages(recipe, RECIPE.parent, overlap=True)
    onnx = [s for s in stages if s.name in ("export_onnx", "fp16")]
    assert [s.name for s in stages[:2]] == ["export_onnx", "fp16"]
    assert all(s.background and s.lane == "onnx" and isinstance(s.run, ChildRun) for s in onnx)
    assert not any(s.background for s in stages if s.name not in ("export_onnx", "fp16"))
    in_front = plan_stages(recipe, RECIPE.parent, overlap=False)
    assert not any(s.background for s in in_front)
    assert [s.name for s in in_front][:2] == ["export_torchscript", "export_onnx"]
    assert {s.name: s.config for s in stages} == {s.name: s.config for s in in_front}  # same fingerprints
    assert "export_onnx" in ONNX_BUILDS


def test_validation_takes_the_graphs_late_and_passes_them(deploys: tuple) -> None:
    behind, _, _, _ = deploys
    assert {name: r.status for name, r in behind.items()} == dict.fromkeys(KEEP, "ran")
    assert behind["fp16"].why == "input still building in the background: onnx-fp32"
    assert behind["validate"].why.startswith("input still building in the background: onnx-fp32")
    assert set(behind["validate"].inputs) == {"torchscript-fp32", "onnx-fp32", "onnx-fp16"}
    assert behind["validate"].details["passed"] == ["torchscript-fp32", "onnx-fp32", "onnx-fp16"]


def test_the_files_are_the_ones_the_in_process_plan_makes(deploys: tuple) -> None:
    behind, behind_dir, front, front_dir = deploys
    for name in ("model.onnx", "model.fp16.onnx"):
        made = [hashlib.sha256((d / name).read_bytes()).hexdigest() for d in (behind_dir, front_dir)]
        assert made[0] == made[1], name
    assert behind["fp16"].fingerprint == front["fp16"].fingerprint


def test_torch_compile_runs_ahead_of_validation_on_a_lane_of_its_own() -> None:
    pt2 = "variants.build=[onnx-fp32, exported-fp32]"
    recipe = load(RECIPE, [pt2, "export.pt2.device=cpu"]).recipe
    stages = {s.name: s for s in plan_stages(recipe, RECIPE.parent, overlap=True)}
    ahead = stages["warm_compile_fp32"]
    assert (ahead.background, ahead.lane, ahead.consumes) == (True, "torch-compile", ("exported-fp32",))
    assert isinstance(ahead.run, ChildRun) and ahead.produces == ("cache:torch-compile-fp32",)
    names = list(stages)
    assert names.index("export_pt2_fp32") < names.index("warm_compile_fp32") < names.index("validate")
    assert "cache:torch-compile-fp32" in stages["validate"].consumes_any
    assert stages["benchmark"].quiet  # nothing compiles beside the timing
    assert "warm_compile_fp32" not in {s.name for s in plan_stages(recipe, RECIPE.parent, overlap=False)}
