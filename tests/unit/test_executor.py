"""Executor: fingerprints, reuse of fresh stages through the cache, keep-going past a failed variant, plan."""

from __future__ import annotations

from pathlib import Path

from pipeline.executor import Executor, fingerprint
from pipeline.run_record import read_records
from pipeline.stages.base import Output, RunContext, Stage, StageConfig, StageResult
from pipeline.store import Store


class TextConfig(StageConfig):
    text: str


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


def _deploy(tmp_path: Path, stages: list[Stage], version: str) -> tuple[list, Path]:
    store = Store(tmp_path, "t")
    latest = store.latest()
    executor = Executor(stages, store, [(latest, read_records(latest))] if latest else [])
    work = store.new_work_dir()
    records = executor.run(RunContext(work), False, lambda s, w: None, lambda r: None)
    return records, store.publish(work, version, signed_off=True)


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
    _deploy(tmp_path, stages, "v0001")
    assert calls == ["A", "B"]
    store = Store(tmp_path, "t")
    plan = Executor(stages, store, [(store.latest(), read_records(store.latest()))]).plan()
    assert all(v.fresh for _, v in plan)
    calls.clear()
    changed = [_writer("A", "a", "1", calls=calls), _writer("B", "b", "3", ("a",), calls)]
    plan = Executor(changed, store, [(store.latest(), read_records(store.latest()))]).plan()
    assert [v.fresh for _, v in plan] == [True, False] and "config changed: text" in plan[1][1].why
    records, v2 = _deploy(tmp_path, changed, "v0002")
    assert calls == ["B"] and [r.status for r in records] == ["reused", "ran"]
    assert records[0].reused_from == "v0001" and (v2 / "a.txt").read_text() == "1"


def test_upstream_change_marks_dependents_stale_in_the_plan(tmp_path: Path) -> None:
    _deploy(tmp_path, [_writer("A", "a", "1"), _writer("B", "b", "2", ("a",))], "v0001")
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
    records, version = _deploy(tmp_path, stages, "v0001")
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
    _, v1 = _deploy(tmp_path, stages, "v0001")
    store = Store(tmp_path, "t")
    for path in [store.cache_path(read_records(v1)["A"].outputs[0]["sha256"]), v1 / "a.txt"]:
        path.unlink()
    plan = Executor(stages, store, [(v1, read_records(v1))]).plan()
    assert not plan[0][1].fresh and "missing or modified" in plan[0][1].why


def test_failed_stage_is_reused_as_failed_unless_retry_is_asked(tmp_path: Path) -> None:
    stages = [_writer("A", "a", "1"), _failing("F", "f")]
    _deploy(tmp_path, stages, "v0001")
    store = Store(tmp_path, "t")
    previous = [(store.latest(), read_records(store.latest()))]
    assert all(v.fresh for _, v in Executor(stages, store, previous).plan())
    retry = Executor(stages, store, previous, retry_failed=True).plan()
    assert [v.fresh for _, v in retry] == [True, False] and "--retry-failed" in retry[1][1].why
