"""Executor: fingerprints, reuse of fresh stages through the cache, keep-going past a failed variant, plan."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest

from pipeline.release.store import Store
from pipeline.run import scheduling
from pipeline.run.executor import Executor
from pipeline.run.freshness import fingerprint
from pipeline.stages.base import (
    ALONE,
    BACKGROUND,
    FRONT,
    Late,
    Output,
    RunContext,
    Stage,
    StageConfig,
    StageResult,
)
from pipeline.stages.record import read_records
from tests.unit.executor_fixtures import TextConfig, deploy, late_checker


def _writer(
    name: str, artifact: str, text: str, consumes: tuple[str, ...] = (), calls: list | None = None
) -> Stage:
    def run(ctx: RunContext, config: TextConfig, inputs: dict) -> StageResult:
        if calls is not None:
            calls.append(name)
        upstream = "".join(inputs[n].path.read_text() for n in consumes)
        ctx.path(f"{artifact}.txt").write_text(upstream + config.text)
        return StageResult([Output(f"{artifact}.txt", "onnx", artifact, "fp32")])

    return Stage(
        name=name, version=1, run=run, config=TextConfig(text=text), consumes=consumes, produces=(artifact,)
    )


def _failing(name: str, artifact: str) -> Stage:
    def run(ctx: RunContext, config: StageConfig, inputs: dict) -> StageResult:
        raise ValueError("unsupported op Foo")

    return Stage(name=name, version=1, config=StageConfig(), run=run, consumes=("a",), produces=(artifact,))


def test_fingerprint_depends_on_config_inputs_and_environment() -> None:
    stage = _writer("s", "a", "1")
    base = fingerprint(stage, {"x": "1"}, {"torch": "2"})
    assert base == fingerprint(stage, {"x": "1"}, {"torch": "2"})
    assert base != fingerprint(_writer("s", "a", "2"), {"x": "1"}, {"torch": "2"})
    assert base != fingerprint(stage, {"x": "2"}, {"torch": "2"})
    assert base != fingerprint(stage, {"x": "1"}, {"torch": "3"})


def test_fresh_stages_are_reused_and_changed_ones_rerun(tmp_path: Path) -> None:
    calls: list[str] = []
    stages = [_writer("A", "a", "1", calls=calls), _writer("B", "b", "2", ("a",), calls)]
    deploy(tmp_path, stages, "v0001")
    assert calls == ["A", "B"]
    store = Store(tmp_path, "t")
    plan = Executor(stages, store, [(store.latest(), read_records(store.latest()))]).plan()
    assert all(v.fresh for _, v in plan)
    calls.clear()
    changed = [_writer("A", "a", "1", calls=calls), _writer("B", "b", "3", ("a",), calls)]
    plan = Executor(changed, store, [(store.latest(), read_records(store.latest()))]).plan()
    assert [v.fresh for _, v in plan] == [True, False] and "config changed: text" in plan[1][1].why
    records, v2 = deploy(tmp_path, changed, "v0002")
    assert calls == ["B"] and [r.status for r in records] == ["reused", "ran"]
    assert records[0].reused_from == "v0001" and (v2 / "a.txt").read_text() == "1"


def test_upstream_change_marks_dependents_stale_in_the_plan(tmp_path: Path) -> None:
    deploy(tmp_path, [_writer("A", "a", "1"), _writer("B", "b", "2", ("a",))], "v0001")
    store = Store(tmp_path, "t")
    plan = Executor(
        [_writer("A", "a", "9"), _writer("B", "b", "2", ("a",))],
        store,
        [(store.latest(), read_records(store.latest()))],
    ).plan()
    assert [v.why for _, v in plan][1] == "input will be rebuilt: a"


def test_failed_variant_skips_its_dependents_and_others_go_on(tmp_path: Path) -> None:
    stages = [
        _writer("A", "a", "1"),
        _failing("F", "f"),
        _writer("G", "g", "x", ("f",)),
        _writer("B", "b", "2", ("a",)),
    ]
    records, version = deploy(tmp_path, stages, "v0001")
    status = {r.name: r.status for r in records}
    assert status == {"A": "ran", "F": "failed", "G": "skipped", "B": "ran"}
    failed = next(r for r in records if r.name == "F")
    assert "unsupported op Foo" in failed.error and (version / "logs/F.error.txt").is_file()
    skipped = next(r for r in records if r.name == "G")
    assert "F failed" in skipped.error
    assert set(read_records(version)) == {"A", "F", "G", "B"}


def test_modified_cache_and_version_file_force_a_rebuild(tmp_path: Path) -> None:
    calls: list[str] = []
    stages = [_writer("A", "a", "1", calls=calls)]
    _, v1 = deploy(tmp_path, stages, "v0001")
    store = Store(tmp_path, "t")
    for path in [store.cache_path(read_records(v1)["A"].outputs[0]["sha256"]), v1 / "a.txt"]:
        path.unlink()
    plan = Executor(stages, store, [(v1, read_records(v1))]).plan()
    assert not plan[0][1].fresh and "missing or modified" in plan[0][1].why


def test_failed_stage_is_reused_as_failed_unless_retry_is_asked(tmp_path: Path) -> None:
    stages = [_writer("A", "a", "1"), _failing("F", "f")]
    deploy(tmp_path, stages, "v0001")
    store = Store(tmp_path, "t")
    previous = [(store.latest(), read_records(store.latest()))]
    assert all(v.fresh for _, v in Executor(stages, store, previous).plan())
    retry = Executor(stages, store, previous, retry_failed=True).plan()
    assert [v.fresh for _, v in retry] == [True, False] and "--retry-failed" in retry[1][1].why


# ---------------------------------------------------------------- background stages


def _background(name: str, artifact: str, gate: threading.Event, seen: list, fail: bool = False) -> Stage:
    """A background stage that waits (bounded) for `gate`: it records whether the stages in front ran while
    it was still working, which is the point of running it in the background."""

    def run(ctx: RunContext, config: TextConfig, inputs: dict) -> StageResult:
        seen.append(("gate opened while building", gate.wait(timeout=20)))
        if fail:
            raise ValueError("compiler crashed")
        ctx.path(f"{artifact}.txt").write_text(inputs["a"].path.read_text() + config.text)
        return StageResult([Output(f"{artifact}.txt", "aoti", artifact, "fp32")])

    return Stage(
        name=name,
        version=1,
        run=run,
        config=TextConfig(text="+bg"),
        consumes=("a",),
        produces=(artifact,),
        placement=BACKGROUND,
    )


def _checker(gate: threading.Event, seen: list) -> Stage:
    """A takes_late stage (as validate): checks what is built, opens the gate, then waits for the late one."""

    def inspect(inputs: dict) -> list[str]:
        ready = sorted(n for n, v in inputs.items() if not isinstance(v, Late))
        late = sorted(n for n, v in inputs.items() if isinstance(v, Late))
        seen.append(("ready", ready))
        seen.append(("late", late))
        gate.set()
        resolved = {n: inputs[n].wait() for n in late}
        seen.append(("resolved", {n: r.path.read_text() if r else None for n, r in resolved.items()}))
        return ready + late

    return late_checker(("a", "b", "aoti"), inspect)


def test_background_stage_builds_while_a_late_taking_stage_checks_the_rest(tmp_path: Path) -> None:
    gate, seen = threading.Event(), []
    stages = [
        _writer("A", "a", "1"),
        _background("AOTI", "aoti", gate, seen),
        _writer("B", "b", "2", ("a",)),
        _checker(gate, seen),
        _writer("USE", "u", "!", ("aoti",)),
    ]
    records, version = deploy(tmp_path, stages, "v0001")
    assert ("gate opened while building", True) in seen  # the checker ran while the compile was going on
    assert ("ready", ["a", "b"]) in seen and ("late", ["aoti"]) in seen
    assert ("resolved", {"aoti": "1+bg"}) in seen
    status = {r.name: (r.status, r.why) for r in records}
    assert status["AOTI"][0] == status["check"][0] == status["USE"][0] == "ran"
    assert status["check"][1] == "input still building in the background: aoti"
    assert (version / "u.txt").read_text() == "1+bg!"  # its hard consumer waited for it
    check = next(r for r in records if r.name == "check")
    assert set(check.inputs) == {"a", "b", "aoti"}  # fingerprinted on what it consumed in the end
    # the same plan again: everything is reused, the background stage and the late-taking one included
    store = Store(tmp_path, "t")
    plan = Executor(stages, store, [(version, read_records(version))]).plan()
    assert all(v.fresh for _, v in plan), [(s.name, v.why) for s, v in plan]


def test_failed_background_stage_is_absent_for_late_takers_and_skips_its_consumers(tmp_path: Path) -> None:
    gate, seen = threading.Event(), []
    stages = [
        _writer("A", "a", "1"),
        _background("AOTI", "aoti", gate, seen, fail=True),
        _checker(gate, seen),
        _writer("USE", "u", "!", ("aoti",)),
    ]
    records, version = deploy(tmp_path, stages, "v0001")
    assert ("resolved", {"aoti": None}) in seen
    status = {r.name: r.status for r in records}
    assert status == {"A": "ran", "AOTI": "failed", "check": "ran", "USE": "skipped"}
    assert "compiler crashed" in (version / "logs/AOTI.error.txt").read_text()
    assert "AOTI failed" in next(r for r in records if r.name == "USE").error


def _sleeper(
    name: str, artifact: str, spans: list, critical: bool = False, meet: threading.Barrier | None = None
) -> Stage:
    """A background stage that takes a moment and says when it ran; critical ones then raise. With `meet`, it
    waits there for the others (a broken barrier fails it: they never ran at once)."""

    def run(ctx: RunContext, config: TextConfig, inputs: dict) -> StageResult:
        started = time.monotonic()
        if meet is not None:
            meet.wait(timeout=10)
        time.sleep(0.3)
        spans.append((name, started, time.monotonic()))
        if critical:
            raise RuntimeError("a bug in the stage")
        ctx.path(f"{artifact}.txt").write_text(config.text)
        return StageResult([Output(f"{artifact}.txt", "aoti", artifact, "fp32")])

    return Stage(
        name=name,
        version=1,
        run=run,
        config=TextConfig(text=name),
        produces=(artifact,),
        placement=BACKGROUND,
        critical=critical,
    )


def _background_spans(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, cores: int, meet: threading.Barrier | None = None
) -> list:
    """Two background stages deployed on a host with `cores` cores: when each ran."""
    monkeypatch.setattr(scheduling.os, "sched_getaffinity", lambda pid: set(range(cores)))
    spans: list = []
    stages = [_sleeper("P", "p", spans, meet=meet), _sleeper("Q", "q", spans, meet=meet)]
    records, _ = deploy(tmp_path, stages, "v0001")
    assert {r.name: r.status for r in records} == {"P": "ran", "Q": "ran"}
    return sorted(spans, key=lambda s: s[1])


def test_background_stages_take_turns_on_a_small_host(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (_, _, first_end), (_, second_start, _) = _background_spans(tmp_path, monkeypatch, cores=4)
    assert second_start >= first_end  # one slot: the second started when the first had finished


def test_two_background_stages_run_at_once_on_sixteen_cores(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A GPU host's two AOTInductor compiles: each waits for the other inside its run, which only two slots
    allow."""
    _background_spans(tmp_path, monkeypatch, cores=16, meet=threading.Barrier(2))


def test_two_slots_from_sixteen_cores_and_never_more() -> None:
    assert [scheduling.background_slots(n) for n in (1, 2, 8, 15, 16, 64, 128)] == [1, 1, 1, 1, 2, 2, 2]


def test_a_quiet_stage_waits_for_the_background_and_a_plain_one_does_not(tmp_path: Path) -> None:
    """TensorRT times tactics (a quiet stage): no background compile runs beside it; other builds go on."""
    spans: list = []
    marks: dict[str, float] = {}

    def stamped(name: str, quiet: bool) -> Stage:
        def run(ctx: RunContext, config: TextConfig, inputs: dict) -> StageResult:
            marks[name] = time.monotonic()
            ctx.path(f"{name}.txt").write_text(name)
            return StageResult([Output(f"{name}.txt", "onnx", name, "fp32")])

        return Stage(
            name=name,
            version=1,
            run=run,
            config=TextConfig(text=name),
            produces=(name,),
            placement=ALONE if quiet else FRONT,
        )

    stages = [_sleeper("AOTI", "aoti", spans), stamped("plain", False), stamped("engine", True)]
    records, _ = deploy(tmp_path, stages, "v0001")
    assert {r.name: r.status for r in records} == {"AOTI": "ran", "plain": "ran", "engine": "ran"}
    ((_, _, compiled),) = spans
    assert marks["plain"] < compiled <= marks["engine"]


def test_a_critical_failure_in_a_background_stage_stops_the_run(tmp_path: Path) -> None:
    spans: list = []
    with pytest.raises(RuntimeError, match="a bug in the stage"):
        deploy(tmp_path, [_sleeper("P", "p", spans, critical=True), _writer("A", "a", "1")], "v0001")


def test_a_rerun_names_the_setting_that_changed() -> None:
    """A hold-out's edit to its model's module re-ran every stage with 'config changed: model', naming neither
    the file nor the setting."""
    from pipeline.run.freshness import changed_paths

    before = {
        "validation": {"tolerances": {"fp32": {"max_abs": 1e-3, "cosine": 0.9999}}},
        "model": {"digest": "a"},
    }
    after = {
        "validation": {"tolerances": {"fp32": {"max_abs": 1e-12, "cosine": 0.9999}}},
        "model": {"digest": "b"},
    }
    assert changed_paths(before, after) == ["model.digest", "validation.tolerances.fp32.max_abs"]
    assert changed_paths(before, before) == []
    assert changed_paths({"a": [1, 2]}, {"a": [1, 3], "b": None}) == ["a"]  # lists and a key set to None
    assert changed_paths({"a": 1}, {"a": 1, "b": 2}) == ["b"]
