"""Lane stages (Stage.lane): run in the lane's worker process, one after another, beside the stages in
front; one whose inputs its lane is still making waits in its own job, not in front."""

from __future__ import annotations

import errno
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from pipeline.release.store import Store
from pipeline.run.executor import Executor
from pipeline.stages.base import Late, Output, RunContext, Stage, StageConfig, StageResult, on_lane
from pipeline.stages.record import read_records
from tests.unit.executor_fixtures import TextConfig, deploy, late_checker


class LaneConfig(StageConfig):
    text: str
    artifact: str
    consumes: tuple[str, ...] = ()
    fail: bool = False
    die: bool = False
    disk_full: bool = False
    sleep_s: float = 0.3


def run_on_lane(ctx: RunContext, config: LaneConfig, inputs: dict) -> StageResult:
    """Writes its inputs' text, its own and the process it ran in; takes a moment, so that the front can be
    seen going on meanwhile. Module-level: the lane's worker process gets it by name."""
    time.sleep(config.sleep_s)
    if config.disk_full:  # as a library reports it: its own error, the OSError as the cause
        raise RuntimeError("could not save the model") from OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
    if config.fail:
        raise ValueError("unsupported op Foo")
    if config.die:  # a native crash, as far as the deploy can tell
        print("Fatal Python error: Segmentation fault", flush=True)
        os.kill(os.getpid(), signal.SIGKILL)
    upstream = "".join(inputs[n].path.read_text().split("@")[0] for n in config.consumes)
    ctx.path(f"{config.artifact}.txt").write_text(f"{upstream}{config.text}@{os.getpid()}@{time.time()}")
    return StageResult(
        [Output(f"{config.artifact}.txt", "onnx", config.artifact, "fp32")], details={"pid": os.getpid()}
    )


def _lane_stage(name: str, artifact: str, consumes: tuple[str, ...] = (), **how: Any) -> Stage:
    """`how`: LaneConfig's fail, die, disk_full, sleep_s."""
    return Stage(
        name=name,
        version=1,
        run=run_on_lane,
        config=LaneConfig(text=name, artifact=artifact, consumes=consumes, **how),
        consumes=consumes,
        produces=(artifact,),
        placement=on_lane("onnx"),
    )


def _front(name: str, artifact: str, spans: list) -> Stage:
    def run(ctx: RunContext, config: TextConfig, inputs: dict) -> StageResult:
        spans.append((name, time.monotonic()))
        ctx.path(f"{artifact}.txt").write_text(config.text)
        return StageResult([Output(f"{artifact}.txt", "torchscript", artifact, "fp32")])

    return Stage(name=name, version=1, run=run, config=TextConfig(text=name), produces=(artifact,))


def _checker(seen: list, names: tuple[str, ...] | list[str] = ("ts", "onnx", "fp16", "opt")) -> Stage:
    def inspect(inputs: dict) -> list[str]:
        seen.append(("late", sorted(n for n, v in inputs.items() if isinstance(v, Late))))
        seen.append(("checked", time.monotonic()))
        texts = {}
        for name, value in sorted(inputs.items()):
            record = value.wait() if isinstance(value, Late) else value
            texts[name] = record.path.read_text() if record else None
        seen.append(("texts", texts))
        return sorted(texts)

    return late_checker(tuple(names), inspect)


def test_a_lane_runs_in_one_worker_process_beside_the_front(tmp_path: Path) -> None:
    spans, seen = [], []
    started = time.monotonic()
    stages = [
        _lane_stage("export", "onnx"),
        _lane_stage("fp16", "fp16", ("onnx",)),  # chained: waits for export in its own job
        _front("ts", "ts", spans),
        _lane_stage("opt", "opt", ("fp16",)),
        _checker(seen),
    ]
    records, version = deploy(tmp_path, stages, "v0001")
    # the front ran at once, not after the lane's 0.9 s; the checker met the lane's artifacts late
    assert spans[0][1] - started < 0.3, spans
    assert ("late", ["fp16", "onnx", "opt"]) in seen
    texts = next(v for k, v in seen if k == "texts")
    pids = {name: text.split("@")[1] for name, text in texts.items() if "@" in text}
    assert len(set(pids.values())) == 1 and str(os.getpid()) not in pids.values()  # one worker, not us
    assert [texts[n].split("@")[0] for n in ("onnx", "fp16", "opt")] == [
        "export",
        "exportfp16",
        "exportfp16opt",
    ]
    status = {r.name: r.status for r in records}
    assert status == {"export": "ran", "fp16": "ran", "ts": "ran", "opt": "ran", "check": "ran"}
    assert (version / "opt.txt").read_text().startswith("exportfp16opt@")
    assert not _children_of_mine(), "the worker outlived the run"
    # again: every stage is fresh and reused, the chained ones included
    store = Store(tmp_path, "t")
    plan = Executor(stages, store, [(version, read_records(version))]).plan()
    assert all(v.fresh for _, v in plan), [(s.name, v.why) for s, v in plan]
    records, _ = deploy(tmp_path, stages, "v0002")
    assert {r.status for r in records if r.name != "check"} == {"reused"}


def test_a_lanes_worker_starts_with_the_run_before_the_stages_in_front_of_it(tmp_path: Path) -> None:
    """Its interpreter starting (imports, the model) overlaps the stages planned before the lane's first."""
    spans: list = []

    def front(ctx: RunContext, config: TextConfig, inputs: dict) -> StageResult:
        spans.append(("children", _children_of_mine()))
        ctx.path("ts.txt").write_text("ts")
        return StageResult([Output("ts.txt", "torchscript", "ts", "fp32")])

    stages = [
        Stage(name="ts", version=1, run=front, config=TextConfig(text="ts"), produces=("ts",)),
        _lane_stage("export", "onnx"),
    ]
    records, version = deploy(tmp_path, stages, "v0001")
    (worker,) = spans[0][1]
    assert (version / "onnx.txt").read_text().split("@")[1] == str(worker)
    records, _ = deploy(tmp_path, stages, "v0002")  # nothing to run on the lane: its worker is killed
    assert {r.status for r in records} == {"reused"} and not _children_of_mine()


def test_a_lane_runs_its_stages_in_plan_order(tmp_path: Path) -> None:
    """Three stages wait for the same export: they run in the order of the plan (validation's order), not in
    whichever order their threads wake up."""
    seen: list = []
    names = ["int8", "fp16", "opt", "dyn"]
    stages = [_lane_stage("export", "onnx")]
    stages += [_lane_stage(name, name, ("onnx",)) for name in names] + [_checker(seen, names)]
    deploy(tmp_path, stages, "v0001")
    texts = next(v for k, v in seen if k == "texts")
    started = [float(texts[name].split("@")[2]) for name in names]
    assert started == sorted(started), dict(zip(names, started, strict=True))


def _broken_lane(tmp_path: Path, seen: list, opt_consumes: str, **broken: bool) -> tuple[list, Path, dict]:
    """export, then fp16 broken as told, then opt built from `opt_consumes`: the records, version, statuses."""
    stages = [
        _lane_stage("export", "onnx"),
        _lane_stage("fp16", "fp16", ("onnx",), **broken),
        _lane_stage("opt", "opt", (opt_consumes,)),
        _checker(seen),
    ]
    records, version = deploy(tmp_path, stages, "v0001")
    return records, version, {r.name: r.status for r in records}


def test_a_failed_lane_stage_keeps_its_error_and_skips_what_is_built_from_it(tmp_path: Path) -> None:
    seen: list = []
    records, version, status = _broken_lane(tmp_path, seen, "fp16", fail=True)
    assert status == {"export": "ran", "fp16": "failed", "opt": "skipped", "check": "ran"}
    failed = next(r for r in records if r.name == "fp16")
    assert failed.error == "ValueError: unsupported op Foo"  # its own type and message, from the worker
    log = (version / "logs/fp16.error.txt").read_text()
    assert "worker process" in log and "unsupported op Foo" in log
    assert "fp16 failed" in next(r for r in records if r.name == "opt").error
    assert ("texts", {"onnx": (version / "onnx.txt").read_text(), "fp16": None, "opt": None}) in seen


def test_a_lane_worker_that_dies_fails_its_stage_and_the_next_stage_gets_a_new_worker(tmp_path: Path) -> None:
    seen: list = []
    records, _, status = _broken_lane(tmp_path, seen, "onnx", die=True)
    assert status == {"export": "ran", "fp16": "failed", "opt": "ran", "check": "ran"}
    died = next(r for r in records if r.name == "fp16")
    assert "worker process was killed by signal 9 while running fp16" in died.error
    assert died.error.endswith("last output: Fatal Python error: Segmentation fault")
    texts = next(v for k, v in seen if k == "texts")
    assert texts["fp16"] is None and texts["opt"].startswith("exportopt@")
    assert texts["onnx"].split("@")[1] != texts["opt"].split("@")[1]  # a new worker after the first died
    assert not _children_of_mine()


def test_a_stopping_run_kills_its_lane_worker(tmp_path: Path) -> None:
    """A critical failure in front while the lane's worker is in a long job: the run stops at once."""

    def boom(ctx: RunContext, config: TextConfig, inputs: dict) -> StageResult:
        time.sleep(2)  # the lane's job has started
        raise RuntimeError("a bug in front")

    stages = [
        _lane_stage("export", "onnx", sleep_s=120),
        Stage(name="bug", version=1, run=boom, config=TextConfig(text="x"), produces=("x",), critical=True),
    ]
    store = Store(tmp_path, "t")
    executor = Executor(stages, store, [])
    started = time.monotonic()
    try:
        executor.run(RunContext(store.new_work_dir()), False, lambda s, w: None, lambda r: None)
    except RuntimeError as exc:
        assert "a bug in front" in str(exc)
    else:
        raise AssertionError("the critical failure was not raised")
    assert time.monotonic() - started < 30, "the run waited for the lane's job instead of stopping it"
    assert not _children_of_mine()


def test_a_full_disk_in_a_lane_stage_stops_the_run_as_in_front(tmp_path: Path) -> None:
    """Pickling drops an exception's cause: the worker sends the OSError itself, so the run stops (to be
    resumed) instead of recording a failed variant that the next deploy would reuse."""
    stages = [_lane_stage("export", "onnx", disk_full=True)]
    store = Store(tmp_path, "t")
    executor = Executor(stages, store, [])
    try:
        executor.run(RunContext(store.new_work_dir()), False, lambda s, w: None, lambda r: None)
    except OSError as exc:
        assert exc.errno == errno.ENOSPC
    else:
        raise AssertionError("a full disk was recorded as a failed variant")
    assert not _children_of_mine()


def test_a_lane_stage_records_its_own_time_not_its_wait_for_the_lane(tmp_path: Path) -> None:
    stages = [
        _lane_stage("export", "onnx", sleep_s=0.1),
        _lane_stage("slow", "slow", ("onnx",), sleep_s=1.5),
        _lane_stage("quick", "quick", ("onnx",), sleep_s=0.1),
    ]
    records, _ = deploy(tmp_path, stages, "v0001")
    took = {r.name: r.duration_s for r in records}
    assert took["slow"] >= 1.5 and took["quick"] < 1.0, took  # quick waited 1.5 s for slow: not its time


def _children_of_mine() -> list[int]:
    """This process's child processes still running (zombies are reaped ones' leftovers: not counted), except
    Python's multiprocessing resource tracker: any earlier test in this worker that used shared memory (PyTriton
    does) starts it once, and it lives as long as the process, by design; and the tests' warm CLI server
    (tests/warm_cli.py), which an earlier test in this worker may have started, for the same reason."""
    me, found = os.getpid(), []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            command = (entry / "cmdline").read_bytes()
        except OSError:
            continue
        fields = stat.rsplit(")", 1)[1].split()
        if (
            int(fields[1]) == me
            and fields[0] != "Z"
            and b"multiprocessing.resource_tracker" not in command
            and b"tests.warm_cli_server" not in command
        ):
            found.append(int(entry.name))
    return found


def test_the_plan_puts_the_onnx_builds_on_a_lane_where_nothing_in_front_waits_for_them() -> None:
    from pipeline.run.plan import ONNX_LANE, plan_stages
    from tests.unit.stages.onnx_fixtures import tiny_context

    recipe = tiny_context(Path("."), "variants.build=[torchscript-fp32, onnx-fp32, onnx-fp16]").recipe
    laned = {s.name: s.lane for s in plan_stages(recipe, Path("."), overlap=True)}
    assert laned["export_onnx"] == laned["fp16"] == ONNX_LANE and laned["export_torchscript"] is None
    assert all(s.background for s in plan_stages(recipe, Path("."), overlap=True) if s.lane)
    assert not any(s.lane or s.background for s in plan_stages(recipe, Path("."), overlap=False))
    # a TensorRT build in front would wait for the lane's graph: then there is no lane
    engine = tiny_context(Path("."), "variants.build=[onnx-fp32, onnx-fp16, engine-fp16]").recipe
    stages = plan_stages(engine, Path("."), overlap=True)
    (engine_stage,) = [
        s for s in stages if s.name.endswith("-fp16") and s.name not in ("fp16", "export_onnx")
    ]
    if engine_stage.consumes:  # a TensorRT builder is installed: the build consumes the FP16 graph
        assert not any(s.lane for s in stages)
    else:  # no builder: its stage fails at once and waits for nothing
        assert {s.name for s in stages if s.lane} == {"export_onnx", "fp16"}


def sleep_on_lane(ctx: RunContext, config: str, inputs: dict) -> StageResult:
    Path(config).write_text("running")  # the test kills the deploy once the job runs
    time.sleep(120)
    raise AssertionError("never reached: the deploy was killed")


def test_a_busy_lane_worker_does_not_outlive_a_killeddeploy(tmp_path: Path) -> None:
    script = (
        "import os, signal, threading, time\n"
        "from pathlib import Path\n"
        "from pipeline.run.lane_worker import LaneWorker\n"
        "from tests.unit.test_lanes import sleep_on_lane\n"
        f"worker = LaneWorker('onnx', Path({str(tmp_path)!r}), None, threads=1)\n"
        "print(worker.pid, flush=True)\n"
        f"marker = Path({str(tmp_path / 'running')!r})\n"
        "job = (sleep_on_lane, str(marker), {})\n"
        "runs = threading.Thread(target=worker.run, args=('sleep', job), daemon=True)\n"
        "runs.start()\n"
        "deadline = time.monotonic() + 50\n"
        "while not marker.exists() and runs.is_alive() and time.monotonic() < deadline:\n"  # in the job
        "    time.sleep(0.05)\n"
        "os.kill(os.getpid(), signal.SIGKILL)\n"
    )
    root = Path(__file__).resolve().parents[2]
    killed = subprocess.run(
        [sys.executable, "-c", script],
        cwd=root,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert (tmp_path / "running").exists(), "the job never started on the lane"
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    pid = int(killed.stdout.split()[0])
    deadline = time.monotonic() + 10
    while _running(pid) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not _running(pid), "the lane's worker outlived the deploy that started it"


def _running(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"
