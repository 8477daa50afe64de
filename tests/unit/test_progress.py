"""The deploy's progress display: stage k of N and total time; timestamped lines with a heartbeat when the
output is not a terminal; a live line that keeps moving while the main thread is busy."""

from __future__ import annotations

import io
import re
import time

from rich.console import Console

from pipeline.run.progress import StageProgress
from pipeline.stages.base import BACKGROUND, Stage, StageConfig
from pipeline.stages.record import StageRecord

STAMP = r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d"


def _stage(name: str) -> Stage:
    return Stage(name=name, version=1, config=StageConfig(), run=lambda ctx, config, inputs: None)


def _busy(seconds: float) -> None:
    """Hold the main thread in Python code, as an export does."""
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        sum(range(1000))


def _busy_until(out: io.StringIO, text: str, limit_s: float = 10, after: int = 0) -> None:
    """Keep the main thread busy until the heartbeat has written `text` past offset `after` (or the limit
    passes)."""
    deadline = time.monotonic() + limit_s
    while text not in out.getvalue()[after:] and time.monotonic() < deadline:
        _busy(0.05)


def test_plain_output_has_timestamped_stage_lines_and_a_heartbeat() -> None:
    out = io.StringIO()
    console = Console(file=out, width=200, force_terminal=False)
    with StageProgress(console, total=2, heartbeat_s=0.05) as progress:
        progress.on_start(_stage("export_onnx"), "no previous run")
        progress.report("onnx: exporting with the dynamo exporter")
        _busy_until(out, "running")
        progress.on_done(StageRecord("export_onnx", 1, "fp", "ran", duration_s=1.5, why="no previous run"))
        progress.on_done(StageRecord("benchmark", 2, "fp", "reused", reused_from="v0001"))
    lines = out.getvalue().splitlines()
    assert re.fullmatch(rf"{STAMP} \[1/2\] export_onnx: started \(no previous run\)", lines[0])
    beat = next(line for line in lines if " running " in line)
    assert re.fullmatch(
        rf"{STAMP} \[1/2\] export_onnx running 0:00:\d\d \(total 0:00:\d\d\): onnx: exporting with the dynamo exporter",
        beat,
    )
    assert re.fullmatch(
        rf"{STAMP} \[1/2\]     ran export_onnx +1\.5 s  total 0:00:\d\d  \(no previous run\)", lines[-2]
    )
    assert re.fullmatch(rf"{STAMP} \[2/2\]  reused benchmark +0\.0 s  total 0:00:\d\d from v0001", lines[-1])


def test_live_line_keeps_moving_while_the_main_thread_is_busy() -> None:
    out = io.StringIO()
    console = Console(file=out, width=200, force_terminal=True, color_system=None)
    with StageProgress(console, total=3) as progress:
        progress.on_start(_stage("export_onnx"), "no previous run")
        progress.report("onnx: exporting with the dynamo exporter")
        _busy(1.0)
        progress.on_done(StageRecord("export_onnx", 1, "fp", "ran", duration_s=1.0))
    frames = re.findall(r"(\S) \[1/3\] onnx: exporting with the dynamo exporter", out.getvalue())
    assert len(set(frames)) >= 3, frames  # the spinner turned while nothing else happened
    assert "total 0:00:0" in out.getvalue() and "[1/3]     ran export_onnx" in out.getvalue()


def test_a_background_stage_has_its_own_line_and_shows_in_the_heartbeat() -> None:
    out = io.StringIO()
    console = Console(file=out, width=300, force_terminal=False)
    background = Stage(
        name="aoti_fp16", version=1, config=StageConfig(), run=lambda c, s, i: None, placement=BACKGROUND
    )
    with StageProgress(console, total=2, heartbeat_s=0.05) as progress:
        progress.on_start(background, "no previous run")
        progress.on_start(_stage("validate"), "input still building in the background: aoti-fp16")
        progress.report("validate onnx-fp32 on onnxruntime-cpu at min")
        _busy_until(out, "in the background 0:")
        progress.on_done(StageRecord("aoti_fp16", 1, "fp", "ran", duration_s=80.0, why="no previous run"))
        mark = len(out.getvalue())
        _busy_until(out, "validate running", after=mark)  # a heartbeat after the background stage ended
        progress.on_done(StageRecord("validate", 1, "fp", "ran", duration_s=90.0, why="x"))
    lines = out.getvalue().splitlines()
    assert re.fullmatch(
        rf"{STAMP} \[1/2\] aoti_fp16: started in the background \(no previous run\)", lines[0]
    )
    beats = [line for line in lines if " running " in line]
    assert all("[2/2] validate running" in beat for beat in beats)  # its step stays while aoti ends beside it
    beat = beats[0]
    assert re.search(
        r": validate onnx-fp32 on onnxruntime-cpu at min; aoti_fp16 in the background 0:00:\d\d$", beat
    )
    done = [line for line in lines if " ran " in line]
    assert (
        "aoti_fp16" in done[0] and "80.0 s" in done[0] and "validate" in done[1]
    )  # each stage its own end line
