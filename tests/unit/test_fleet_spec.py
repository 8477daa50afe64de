"""The fleet file's problems are located like a recipe's, and a target no node offers is named by what it
lacks (the nodes as `ray.nodes()` lists them)."""

from __future__ import annotations

import io
from pathlib import Path

import pytest
from rich.console import Console

from pipeline.core.errors import PipelineError
from pipeline.fleet.placement import missing_node
from pipeline.fleet.spec import Target, load_fleet
from tests.user_folder import recipe_with_own_module

ROOT = Path(__file__).resolve().parents[2]


def _problems(tmp_path: Path, text: str) -> list[str]:
    path = tmp_path / "fleet.yaml"
    path.write_text(text)
    with pytest.raises(PipelineError) as caught:
        load_fleet(path)
    return caught.value.lines()


def test_a_valid_fleet_file_resolves_its_paths_from_its_folder(tmp_path: Path) -> None:
    (tmp_path / "r.yaml").write_text("name: r\n")
    path = tmp_path / "fleet.yaml"
    path.write_text("name: f\nroot: out\nrecipes: [r.yaml]\ntargets: [{name: cpu}]\n")
    fleet = load_fleet(path)
    assert fleet.root == str(tmp_path / "out")
    assert [e.path for e in fleet.entries()] == [str(tmp_path / "r.yaml")]
    assert fleet.targets[0].resources() == {"CPU": 1.0} and fleet.retries == 1


def test_fleet_file_problems_name_their_line_and_key(tmp_path: Path) -> None:
    (tmp_path / "r.yaml").write_text("name: r\n")
    lines = _problems(
        tmp_path,
        "name: f\nrecipes: [r.yaml]\ntargets:\n  - {name: cpu, cpus: 2}\n",
    )
    assert any(
        line.startswith(f"{tmp_path}/fleet.yaml:4:") and "unknown key 'cpus'" in line for line in lines
    ), lines
    twice = _problems(tmp_path, "name: f\nrecipes: [r.yaml]\ntargets:\n  - {name: cpu}\n  - {name: cpu}\n")
    assert twice == [f"{tmp_path}/fleet.yaml:4:3: targets: target names must be unique: cpu more than once"]
    again = _problems(
        tmp_path, "name: f\nrecipes: [r.yaml, {path: r.yaml, set: [a=1]}]\ntargets: [{name: cpu}]\n"
    )
    assert again == [
        f"{tmp_path}/fleet.yaml:2:10: recipes: a recipe may be listed once: r.yaml more than once"
    ]
    missing = _problems(tmp_path, "name: f\nrecipes: [r.yaml, nowhere.yaml]\ntargets: [{name: cpu}]\n")
    assert missing == [f"{tmp_path}/fleet.yaml:2:1: recipes.1: no recipe file at {tmp_path / 'nowhere.yaml'}"]


CPU_NODE = {"Alive": True, "Resources": {"CPU": 2.0, "memory": 1e10}}
GPU_NODE = {"Alive": True, "Resources": {"CPU": 16.0, "GPU": 1.0, "accelerator_type:H100": 1.0}}


def test_a_target_no_node_offers_is_named_by_what_it_lacks() -> None:
    h200 = Target(name="h200", gpu={"type": "H200"})
    assert missing_node(h200, [CPU_NODE, GPU_NODE]) == "no node with gpu:H200 (the cluster has: H100)"
    assert missing_node(Target(name="h100", gpu={"type": "H100"}), [CPU_NODE, GPU_NODE]) is None
    assert missing_node(Target(name="any", gpu={}), [CPU_NODE]) == "no node with gpu"
    assert (
        missing_node(Target(name="big", cpu=4), [CPU_NODE])
        == "no node with 4 CPUs for cpu (the largest offers 2)"
    )
    dead = {**GPU_NODE, "Alive": False}
    assert missing_node(Target(name="h100", gpu={"type": "H100"}), [CPU_NODE, dead]) is not None


def test_a_recipe_a_target_breaks_is_refused_before_ray_starts(tmp_path: Path) -> None:
    from pipeline.fleet.driver import run_fleet

    tiny = ROOT / "tests/recipes/tiny.yaml"
    path = tmp_path / "fleet.yaml"
    path.write_text(
        f"name: f\nrecipes: [{tiny}]\ntargets:\n  - {{name: ok}}\n"
        "  - {name: typo, set: ['benchmark.batch_sizes=[0]']}\n"
    )
    with pytest.raises(PipelineError) as caught:
        run_fleet(path, Console(file=io.StringIO()))
    lines = caught.value.lines()
    assert len(lines) == 1 and lines[0].startswith(
        "--set benchmark.batch_sizes=[0]: benchmark.batch_sizes[0]: must be a positive"
    ), lines
    assert lines[0].endswith("(recipe tiny.yaml on target typo)"), lines


def test_a_cpu_target_deploy_sees_no_gpu_and_a_gpu_target_keeps_its_own(monkeypatch):
    """Ray leaves CUDA_VISIBLE_DEVICES alone for a task that holds no GPU: without hiding, a CPU target's deploy
    on a GPU node would time the GPU and sign it off under the CPU label."""
    from pipeline.core import host
    from pipeline.fleet.task import Job

    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3")
    cpu = Job("cpu", "r.yaml", (), False, ".", 60.0, "/tmp/state")
    gpu = Job("h200", "r.yaml", (), False, ".", 60.0, "/tmp/state", gpu=True)
    assert cpu.environment()["CUDA_VISIBLE_DEVICES"] == ""
    assert gpu.environment()["CUDA_VISIBLE_DEVICES"] == "3"  # Ray's own pinning stays
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", cpu.environment()["CUDA_VISIBLE_DEVICES"])
    assert not host.gpus_visible()
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "-1")
    assert not host.gpus_visible()
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES")
    assert host.gpus_visible()


def test_the_store_mode_is_shared_unless_copy_is_asked_and_a_typo_is_located(tmp_path: Path) -> None:
    (tmp_path / "r.yaml").write_text("name: r\n")
    path = tmp_path / "fleet.yaml"
    path.write_text("name: f\nrecipes: [r.yaml]\ntargets: [{name: cpu}]\n")
    assert load_fleet(path).store == "shared"
    path.write_text("name: f\nstore: copy\nrecipes: [r.yaml]\ntargets: [{name: cpu}]\n")
    assert load_fleet(path).store == "copy"
    lines = _problems(tmp_path, "name: f\nstore: copied\nrecipes: [r.yaml]\ntargets: [{name: cpu}]\n")
    assert len(lines) == 1 and lines[0].startswith(f"{tmp_path}/fleet.yaml:2:") and "'copy'" in lines[0], (
        lines
    )


def test_a_fleet_deploy_imports_the_model_from_the_drivers_folder_and_no_pipeline_py_there_shadows_it(
    tmp_path: Path, monkeypatch
) -> None:
    """The task's own deploy, as a Ray worker runs it (run_job, here without Ray): in the driver's folder, which
    holds the model's module and a pipeline.py of the user's, it runs the tool and signs off."""
    from pipeline.fleet.task import Job, run_job

    (tmp_path / "pipeline.py").write_text("print('the user''s own pipeline.py')\n")
    recipe = recipe_with_own_module(tmp_path, "fleet_encoder")
    monkeypatch.chdir(tmp_path / "..")  # the worker runs elsewhere
    monkeypatch.setenv("PYTHONPATH", str(ROOT))  # tests.models.tiny, which fleet_encoder imports
    sets = (f"output.root={tmp_path / 'store'}",)
    job = Job("cpu", str(recipe), sets, False, str(tmp_path), 600.0, str(tmp_path / "state"))
    done = run_job(job)
    assert done["exit_code"] == 0, done["stderr_tail"]
    assert done["document"]["status"] == "signed_off", done["document"]
