"""The product as a user runs it: `python -m pipeline` on a small real model, through every stage."""

from __future__ import annotations

import hashlib
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import onnx
import pytest

from tests.contract import SPEED_ROW_KEYS
from tests.user_folder import recipe_with_own_module
from tests.warm_cli import run_pipeline

ROOT = Path(__file__).resolve().parents[2]
TINY = ROOT / "tests/recipes/tiny.yaml"
CONTRACT_FILES = [
    "stages.json",
    "recipe.yaml",
    "reports/accuracy.json",
    "reports/speed.json",
    "reports/signoff.md",
    "reports/signoff.html",
    "winner.json",
    "reproduce.sh",
    "manifest.json",
]


def cli(
    *args: str,
    root: Path | None = None,
    timeout: float = 600,
    env: dict[str, str] | None = None,
    fresh: bool = False,
) -> subprocess.CompletedProcess[str]:
    """`python -m pipeline ...` from the repository (tests/warm_cli.py; fresh: a new interpreter)."""
    extra = ["--set", f"output.root={root}"] if root is not None else []
    environ = None if env is None else {**os.environ, **env}
    return run_pipeline([*args, *extra], cwd=ROOT, env=environ, timeout=timeout, fresh=fresh)


def sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.fixture(scope="module")
def first(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, subprocess.CompletedProcess[str]]:
    root = tmp_path_factory.mktemp("out")
    # the builds in front on any host (a GPU host would put them on a lane): the lane test compares with this
    # a new interpreter, as a user starts the first deploy
    return root, cli("deploy", str(TINY), root=root, env={"PIPELINE_ONNX_LANE": "0"}, fresh=True)


def test_first_deploy_signs_off_and_writes_the_contract(first) -> None:
    root, result = first
    assert result.returncode == 0, result.stderr[-3000:]
    version = root / "tiny" / "v0001"
    for rel in CONTRACT_FILES:
        assert (version / rel).is_file(), rel
    assert os.readlink(root / "tiny" / "latest") == "v0001"
    assert list((root / "tiny" / ".work").iterdir()) == []
    assert "signed off" in result.stdout and "onnx-fp32" in result.stdout


def test_manifest_hashes_match_every_file(first) -> None:
    root, _ = first
    version = root / "tiny" / "v0001"
    manifest = json.loads((version / "manifest.json").read_text())
    assert (
        manifest["signed_off"] is True and manifest["version"] == "v0001" and manifest["schema_version"] == 1
    )
    listed = {e["path"] for e in manifest["artifacts"] + manifest["files"]}
    on_disk = {p.relative_to(version).as_posix() for p in version.rglob("*") if p.is_file()} - {
        "manifest.json"
    }
    assert listed == on_disk
    for entry in manifest["artifacts"] + manifest["files"]:
        assert sha(version / entry["path"]) == entry["sha256"], entry["path"]
    kinds = {a["name"]: a["kind"] for a in manifest["artifacts"]}
    assert kinds == {"torchscript-fp32": "torchscript", "onnx-fp32": "onnx"}
    assert {"python", "torch", "onnx", "onnxruntime"} <= set(manifest["environment"])


def test_every_output_axis_is_named_after_its_dim_or_fixed(first) -> None:
    """Whichever exporter made the graph (this recipe's is the TorchScript-based one, which names output axes
    after their nodes), each output axis says which recipe dim it follows or its fixed size: Triton's batching
    and every reader of the signature depend on it."""
    root, _ = first
    graph = onnx.load(str(root / "tiny" / "v0001" / "model.onnx")).graph
    dims = {v.name: [d.dim_param or d.dim_value for d in v.type.tensor_type.shape.dim] for v in graph.output}
    assert dims == {"hidden": ["batch", "sequence", 64], "pooled": ["batch", 64]}


def test_reports_follow_the_contract(first) -> None:
    root, _ = first
    version = root / "tiny" / "v0001"
    accuracy = json.loads((version / "reports/accuracy.json").read_text())
    assert accuracy["reference"] == "torch-fp32"
    for name in ("onnx-fp32", "torchscript-fp32"):
        entry = accuracy["artifacts"][name]
        assert entry["passed"] is True
        assert {c["inputs"] for c in entry["checks"]} == {"min", "opt", "max", "data"}
    speed = json.loads((version / "reports/speed.json").read_text())
    row_keys = SPEED_ROW_KEYS
    assert speed["results"] and all(row_keys <= set(r) for r in speed["results"])
    assert {(r["artifact"], r["batch"]) for r in speed["results"]} >= {
        ("onnx-fp32", 1),
        ("onnx-fp32", 2),
        ("torchscript-fp32", 1),
    }
    winner = json.loads((version / "winner.json").read_text())
    assert winner["artifact"] in ("onnx-fp32", "torchscript-fp32") and winner["unit"] == "ms"
    # one matrix of work: the benchmark timed exactly its cells, each validated on that runtime
    matrix = json.loads((version / "reports/matrix.json").read_text())
    cells = {(c["artifact"], c["runtime"], c["io"], b) for c in matrix["cells"] for b in c["batches"]}
    assert cells == {(r["artifact"], r["runtime"], r["io"], r["batch"]) for r in speed["results"]}
    for artifact, runtime, _, _ in cells - {c for c in cells if c[0] == "torch-fp32"}:
        assert runtime in matrix["validated"][artifact]
        assert accuracy["artifacts"][artifact]["runtimes"][runtime]["passed"] is True
    assert speed["conditions"]["runtimes_timed"]["not_timed"] == matrix["not_timed"]
    stages = {s["name"]: s for s in json.loads((version / "stages.json").read_text())["stages"]}
    assert [
        stages[n]["status"]
        for n in ("export_torchscript", "export_onnx", "validate", "benchmark", "select", "signoff")
    ] == ["ran"] * 6
    assert stages["export_onnx"]["fingerprint"] and stages["export_onnx"]["duration_s"] > 0


def test_second_deploy_is_up_to_date_and_plan_says_fresh(first) -> None:
    root, _ = first
    again = cli("deploy", str(TINY), root=root)
    assert again.returncode == 0 and again.stdout.strip().endswith("up to date: tiny/v0001")
    assert sorted(p.name for p in (root / "tiny").glob("v*")) == ["v0001"]
    plan = cli("plan", str(TINY), root=root)
    assert plan.returncode == 0
    lines = [line for line in plan.stdout.splitlines() if line.startswith("  ")]
    assert len(lines) == 6 and all(line.split()[0] == "fresh" for line in lines)  # sign-off last


def test_changed_tolerance_reuses_exports_and_failed_signoff_keeps_latest(first) -> None:
    root, _ = first
    strict = ["--set", "validation.tolerances.fp32.max_abs=1e-12"]
    plan = cli("plan", str(TINY), *strict, root=root)
    assert "stale  validate                 config changed: validation" in plan.stdout
    result = cli("deploy", str(TINY), *strict, root=root)
    assert result.returncode == 1, result.stdout[-2000:]
    version = root / "tiny" / "v0002"
    stages = {s["name"]: s["status"] for s in json.loads((version / "stages.json").read_text())["stages"]}
    assert stages["export_onnx"] == "reused" and stages["validate"] == "ran"
    manifest = json.loads((version / "manifest.json").read_text())
    assert manifest["signed_off"] is False and not (version / "winner.json").exists()
    assert any("onnx-fp32" in r for r in manifest["signoff_reasons"])
    assert os.readlink(root / "tiny" / "latest") == "v0001"


def test_rebench_makes_a_new_version_reusing_artifacts(first) -> None:
    root, _ = first
    result = cli("deploy", str(TINY), "--rebench", root=root)
    assert result.returncode == 0, result.stderr[-2000:]
    newest = sorted((root / "tiny").glob("v*"))[-1]
    stages = {s["name"]: s["status"] for s in json.loads((newest / "stages.json").read_text())["stages"]}
    assert stages["export_onnx"] == "reused" and stages["benchmark"] == "ran"
    assert sha(newest / "model.onnx") == sha(root / "tiny" / "v0001" / "model.onnx")
    assert os.readlink(root / "tiny" / "latest") == newest.name


BAD = {
    "unknown key": ("benchmark:\n", "benchmark:\n  batch_size: [1]\n", "benchmark.batch_size: unknown key"),
    "wrong type": ("calibration: 8", "calibration: lots", "data.calibration: must be an integer"),
    "negative batch": (
        "batch_sizes: [1, 2]",
        "batch_sizes: [1, -2]",
        "benchmark.batch_sizes[1]: must be a positive integer (got -2)",
    ),
    "min above max": ("sequence: {min: 4,", "sequence: {min: 40,", "dims.sequence.min: must not exceed max"),
    "missing data file": (
        "samples: {source: random, samples: 24}",
        "samples: {source: npz, path: nowhere.npz}",
        "data.samples.path: no such data file",
    ),
    "broken yaml": ("outputs: [hidden, pooled]", "outputs: [hidden, pooled", "(yaml): invalid YAML"),
}


@pytest.mark.parametrize("case", sorted(BAD))
@pytest.mark.parametrize("command", ["validate", "deploy"])
def test_user_errors_exit_2_with_one_located_line(tmp_path: Path, case: str, command: str) -> None:
    old, new, expected = BAD[case]
    text = TINY.read_text()
    assert old in text
    recipe = tmp_path / "bad.yaml"
    recipe.write_text(text.replace(old, new))
    root = tmp_path / "out"
    result = cli(command, str(recipe), root=root, timeout=120)
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and expected in lines[0], result.stderr
    assert lines[0].startswith(f"{recipe}:") and lines[0].split(":")[1].isdigit()
    assert "Traceback" not in result.stderr and not root.exists()


def test_validate_accepts_the_shipped_recipes() -> None:
    """Each recipe validated once (a validate loads the model); the spellings of a shipped recipe's name
    resolve to the same file."""
    from pipeline.recipe.loader import resolve_recipe_path

    found = {resolve_recipe_path(name).resolve() for name in ("bert.yaml", "bert")}
    assert found == {(ROOT / "recipes" / "bert.yaml").resolve()}
    for name in ("bert", str(TINY)):
        result = cli("validate", name, timeout=120)
        assert result.returncode == 0, result.stderr


def test_killed_deploy_leaves_no_version_and_the_next_one_resumes(tmp_path: Path) -> None:
    root = tmp_path / "out"
    proc = subprocess.Popen(
        [sys.executable, "-m", "pipeline", "deploy", str(TINY), "--set", f"output.root={root}"],
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    deadline = time.monotonic() + 300
    try:
        while time.monotonic() < deadline:
            records = list(root.glob("tiny/.work/*/stages.json"))
            if records and '"export_onnx"' in records[0].read_text():
                break
            assert proc.poll() is None, "deploy finished before it could be interrupted"
            time.sleep(0.2)
        os.killpg(proc.pid, signal.SIGKILL)
    finally:
        proc.wait()
    assert not list(root.glob("tiny/v*")) and not (root / "tiny" / "latest").exists()
    result = cli("deploy", str(TINY), root=root)
    assert result.returncode == 0, result.stderr[-2000:]
    stages = {s["name"]: s for s in json.loads((root / "tiny/v0001/stages.json").read_text())["stages"]}
    assert stages["export_onnx"]["status"] == "reused" and stages["export_onnx"]["reused_from"].startswith(
        "2"
    )
    assert list((root / "tiny" / ".work").iterdir()) == []


def test_plan_says_which_stage_runs_in_the_background(tmp_path: Path) -> None:
    variants = "variants.build=[onnx-fp32, aoti-fp32]"
    no_lane = {
        "PIPELINE_ONNX_LANE": "0"
    }  # on a GPU host the ONNX export would run on a lane, in the background
    plan = cli(
        "plan", str(TINY), "--set", variants, "--set", "export.pt2.device=cpu", root=tmp_path, env=no_lane
    )
    assert plan.returncode == 0, plan.stderr
    lines = {line.split()[1]: line for line in plan.stdout.splitlines() if line.startswith("  ")}
    assert lines["aoti_fp32"].endswith("(runs in the background)")
    assert not lines["export_onnx"].endswith("(runs in the background)")
    # the compile starts first, so that the exports run beside it
    assert list(lines).index("aoti_fp32") < list(lines).index("export_onnx") < list(lines).index("validate")


def test_the_onnx_builds_on_a_lane_make_the_same_files_and_sign_off(first, tmp_path: Path) -> None:
    """On a GPU host the ONNX builds run on a lane (a worker process beside validation); forced here: the same
    ONNX export as the deploy in front made, its FP16 conversion chained after it on the lane, signed off."""
    serial_root, _ = first
    variants = "variants.build=[torchscript-fp32, onnx-fp32, onnx-fp16]"
    result = cli("deploy", str(TINY), "--set", variants, root=tmp_path, env={"PIPELINE_ONNX_LANE": "1"})
    assert "export_onnx: started in the background" in result.stderr, result.stderr[-3000:]
    assert "fp16: started in the background (queued on the onnx lane after export_onnx)" in result.stderr
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    version = tmp_path / "tiny" / "v0001"
    assert sha(version / "model.onnx") == sha(serial_root / "tiny" / "v0001" / "model.onnx")
    stages = {s["name"]: s for s in json.loads((version / "stages.json").read_text())["stages"]}
    assert stages["fp16"]["status"] == stages["export_onnx"]["status"] == "ran"
    accuracy = json.loads((version / "reports/accuracy.json").read_text())["artifacts"]
    assert accuracy["onnx-fp32"]["passed"] and accuracy["onnx-fp16"]["passed"]


def test_an_export_of_other_weights_than_the_reference_is_an_internal_error(tmp_path: Path) -> None:
    """ResNet-50 on the H200: the lane worker built the unseeded model again with other random weights, and
    every ONNX variant "failed validation" at cosine 0.067. The export records the digest of the weights it
    exported; validation compares it with the reference's and stops the run naming both (exit 3)."""
    result = cli(
        "deploy",
        str(TINY),
        "--set",
        "model.entrypoint=tests.reliability.bad_models:per_process",
        "--set",
        "model.kwargs={}",
        "--set",
        "variants.build=[onnx-fp32]",
        root=tmp_path,
        env={"PIPELINE_ONNX_LANE": "1"},
    )
    assert result.returncode == 3, result.stdout[-3000:] + result.stderr[-3000:]
    assert "WeightsMismatch: onnx-fp32 was exported from weights " in result.stderr
    assert "but the reference model has weights " in result.stderr
    assert not list((tmp_path / "tiny").glob("v0*"))  # nothing published


def test_the_console_script_is_not_shadowed_by_a_users_pipeline_py(tmp_path: Path) -> None:
    """In a folder holding a pipeline.py of the user's, `python -m pipeline` runs that file; the installed
    `deploy-pipeline` script still runs the tool (the README documents it for this case), imports the model's
    module from that folder, and so do the tool's own Python children (the pre-flight model check, the ONNX
    lane's worker), which the user's pipeline.py must not shadow either."""
    (tmp_path / "pipeline.py").write_text("print('the user''s own pipeline.py')\n")
    shadowed = subprocess.run(
        [sys.executable, "-m", "pipeline", "--version"], cwd=tmp_path, capture_output=True, text=True
    )
    assert "the users own pipeline.py" in shadowed.stdout
    script = Path(sys.executable).parent / "deploy-pipeline"
    assert script.is_file(), "make setup installs the console script"
    tool = subprocess.run([str(script), "--version"], cwd=tmp_path, capture_output=True, text=True)
    assert tool.returncode == 0 and tool.stdout.startswith("deploy-pipeline "), tool.stderr
    recipe = recipe_with_own_module(tmp_path, "my_encoder")
    # tests.models.tiny, which my_encoder imports, from this checkout; the ONNX builds on a lane's worker
    env = {**os.environ, "PYTHONPATH": str(ROOT), "PIPELINE_ONNX_LANE": "1"}
    deployed = subprocess.run(
        [str(script), "deploy", str(recipe), "--set", f"output.root={tmp_path / 'out'}"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
    )
    assert deployed.returncode == 0, deployed.stdout[-2000:] + deployed.stderr[-2000:]
    assert "the users own pipeline.py" not in deployed.stdout + deployed.stderr
    assert (tmp_path / "out" / "tiny" / "latest" / "model.onnx").is_file()


def test_quiet_keeps_the_result_and_verbose_every_message(first) -> None:
    root, _ = first
    quiet = cli("deploy", str(TINY), "-q", "--set", "benchmark.warmup_s=0.11", root=root)
    assert quiet.returncode == 0 and quiet.stderr == "", quiet.stderr[-2000:]
    lines = quiet.stdout.splitlines()
    # a busy host may leave the winner unsettled: still signed off, said so on the same line
    assert re.match(r"signed off( \(provisional: [^)]*\))?: ", lines[0]) and "┃" not in quiet.stdout
    assert any(line.startswith("winner: ") for line in lines)
    verbose = cli("deploy", str(TINY), "-v", "--rebench", "--set", "benchmark.warmup_s=0.11", root=root)
    assert verbose.returncode == 0
    windows = [line for line in verbose.stderr.splitlines() if ": window " in line and "p50" in line]
    assert len(windows) >= 4, verbose.stderr[-3000:]  # each benchmark window, not a heartbeat's latest
