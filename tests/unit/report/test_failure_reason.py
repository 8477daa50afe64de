"""A failure's reason is listed on one line in the console and the sign-off, and that line keeps what follows a
line break: onnx's checker names the offending node on the line after "input 'weight_rows' of node:", and a
hold-out's sign-off stopped at the colon."""

from __future__ import annotations

import onnx
import pytest
from onnx import TensorProto, helper
from rich.console import Console

from pipeline.core.errors import reason_line
from pipeline.decide.verdict import VariantFailure
from pipeline.report.markdown import render_markdown
from pipeline.report.summary import summary_table
from tests.unit.report import samples

NODE = "weight_rows_cast_to_fp32_node"


def _checker_error() -> str:
    """onnx's own message on a graph whose nodes are out of order (as an FP16 conversion left a hold-out's
    graph), recorded as the executor records a stage's exception."""
    rows = helper.make_tensor_value_info("weight_rows_fp16", TensorProto.FLOAT16, [4])
    out = helper.make_tensor_value_info("y", TensorProto.FLOAT, [4])
    nodes = [
        helper.make_node("Cast", ["weight_rows"], ["y"], to=TensorProto.FLOAT, name=NODE),
        helper.make_node("Identity", ["weight_rows_fp16"], ["weight_rows"], name="rows"),
    ]
    with pytest.raises(onnx.checker.ValidationError) as raised:
        onnx.checker.check_model(helper.make_model(helper.make_graph(nodes, "g", [rows], [out])))
    return f"{type(raised.value).__name__}: {raised.value}"


def test_the_reason_keeps_the_lines_after_the_first() -> None:
    error = _checker_error()
    assert "of node: \n" in error  # the message itself breaks the line where the node is named
    assert reason_line(error) == (
        "ValidationError: Nodes in a graph must be topologically sorted, however input 'weight_rows' of node: "
        f"name: {NODE} OpType: Cast is not output of any previous nodes."
    )
    assert reason_line("x" * 50 + "\n" + "y" * 50, 60) == "x" * 50 + " " + "y" * 8 + "…"
    # a Python traceback is not the reason: left out after a message, its last line when alone
    assert reason_line("calibration failed: bins\nTraceback (most recent call last):\n  ...") == (
        "calibration failed: bins"
    )
    assert reason_line("Traceback (most recent call last):\n  File x\nKeyError: 'a'") == "KeyError: 'a'"


def test_the_console_and_the_sign_off_name_the_node(inputs) -> None:
    error = _checker_error()
    failed = [
        {"artifact": "onnx-optimized-fp16", "stage": "fp16", "error": error}
    ]  # not in the samples' rows
    assert (
        NODE in VariantFailure("onnx-optimized-fp16", "fp16", error).describe()
    )  # the console's "failed" lines
    console = Console(width=400, record=True, color_system=None)
    console.print(summary_table(inputs["accuracy"], inputs["speed"], inputs["winner"], None, failed))
    row = next(line for line in console.export_text().splitlines() if "FAILED (fp16)" in line)
    assert f"of node: name: {NODE} OpType: Cast is not output" in row

    header = samples.header() | {"requested": ["onnx-optimized-fp16"], "failed": failed}
    stages = [*inputs["stages"], {"name": "fp16", "status": "failed", "duration_s": 0.1, "error": error}]
    page = render_markdown(**(inputs | {"header": header, "stages": stages}))
    verdict = page[page.index("## Verdict") : page.index("## Winner")]
    assert "| onnx-optimized-fp16 | fp16 | ValidationError: Nodes in a graph" in verdict
    assert f"of node: name: {NODE} OpType: Cast is not output of any previous nodes. |" in verdict
    stage_row = next(line for line in page.splitlines() if line.startswith("| fp16 | failed | 0.1 s |"))
    assert f"of node: name: {NODE} OpType: Cast" in stage_row  # cut at 160 characters: the full error follows


def test_a_failures_reason_is_shown_as_written_not_read_as_markup(inputs) -> None:
    """The console's summary table read failure reasons as Rich markup: "pip install
    'deploy-pipeline[tensorrt-rtx]'" showed as "pip install 'deploy-pipeline'" on the GPU host."""
    error = "StageError: no TensorRT builder installed (pip install 'deploy-pipeline[tensorrt-rtx]' or '[tensorrt]')"
    failed = [{"artifact": "engine-fp16", "stage": "engine-fp16", "error": error}]
    console = Console(width=400, record=True, color_system=None)
    console.print(summary_table(inputs["accuracy"], inputs["speed"], inputs["winner"], None, failed))
    row = next(line for line in console.export_text().splitlines() if "FAILED (engine-fp16)" in line)
    assert "pip install 'deploy-pipeline[tensorrt-rtx]' or '[tensorrt]')" in row, row
