from __future__ import annotations

from rich.console import Console

from pipeline.report.summary import summary_table


def _text(table, width: int = 220) -> str:
    console = Console(width=width, record=True, color_system=None)
    console.print(table)
    return console.export_text()


def _line(text: str, artifact: str) -> str:
    return next(line for line in text.splitlines() if f" {artifact} " in line)


def test_every_artifact_with_verdict_and_latency(inputs):
    text = _text(summary_table(inputs["accuracy"], inputs["speed"], inputs["winner"], None))
    assert "batch 1, 1×128" in text and "batch 8, 8×128" in text
    assert "10.8 / 12.5" in _line(text, "★ onnx-int8-dynamic")
    assert "pass cosine 0.986200" in _line(text, "★ onnx-int8-dynamic")
    failed = _line(text, "onnx-int8")
    assert "FAIL cosine 0.971200 < 0.98" in failed and "36.1 / 41.9" in failed
    assert "184 / 332 ~" in _line(text, "onnx-fp16")  # unstable
    assert "reference" in _line(text, "torch-fp32")
    assert "not runnable on this host: no TensorRT-RTX runtime" in _line(text, "tensorrt-rtx-fp16")
    assert "★ winner: onnx-int8-dynamic (onnxruntime-cpu, host I/O)" in text
    rows = [line for line in text.splitlines() if "onnxruntime-cpu" in line and "│" in line]
    assert "onnx-int8-dynamic" in rows[0]  # fastest first


def test_objective_batch_keeps_only_its_columns(inputs):
    text = _text(summary_table(inputs["accuracy"], inputs["speed"], inputs["winner"], 1))
    assert "batch 1, 1×128" in text and "batch 8" not in text
    assert "65.9" not in text
    assert "unstable row" not in text  # the one unstable row is at batch 8, not shown


def test_no_winner_and_no_speed(inputs):
    text = _text(summary_table(inputs["accuracy"], None, None, 1))
    assert "no winner" in text and "★" not in text
    assert "onnx-int8" in text and "not runnable on this host" in text


def test_narrow_console_keeps_digits(inputs):
    text = _text(summary_table(inputs["accuracy"], inputs["speed"], inputs["winner"], None), width=100)
    assert "…" not in text


def test_a_throughput_objective_shows_and_orders_by_sequences_per_s(inputs):
    """Under sequences_per_s the columns are what selection ranked by, best first; rows without a run say —."""
    rates = {"onnx-fp32": 400.0, "onnx-int8-dynamic": 700.0, "onnx-fp16": 250.0}
    for row in inputs["speed"]["results"]:
        if row["batch"] == 8 and row["artifact"] in rates:
            stable = row["artifact"] != "onnx-fp16"
            row["throughput"] = {"sequences_per_s": rates[row["artifact"]], "stable": stable}
    table = summary_table(
        inputs["accuracy"], inputs["speed"], inputs["winner"], 8, objective_metric="sequences_per_s"
    )
    text = _text(table)
    assert "seq/s" in text and "p50 / p99" not in text and "batch 8, 8×128" in text
    rows = [line for line in text.splitlines() if "onnxruntime-cpu" in line and "│" in line]
    assert "onnx-int8-dynamic" in rows[0] and " 700 " in rows[0]
    assert "onnx-fp32" in rows[1] and " 400 " in rows[1]
    assert "250 ~" in _line(text, "onnx-fp16")  # its throughput run did not settle
    assert "—" in _line(text, "onnx-int8")  # no throughput run: no figure
    assert "~ throughput run did not settle" in text and "unstable row" not in text


def test_an_artifact_left_out_for_a_faster_twin_says_so(inputs):
    """Validated but never timed (a GPU host's rule, pipeline/bench/hosts.py): its line says why no figure."""
    speed = inputs["speed"]
    speed["results"] = [r for r in speed["results"] if r["artifact"] != "onnx-fp32"]
    reason = (
        "its faster twin onnx-optimized-fp32 on onnxruntime-cuda is timed (the same graph without fusions)"
    )
    speed["conditions"]["runtimes_timed"] = {
        "not_timed": [{"artifact": "onnx-fp32", "runtime": "onnxruntime-cuda", "io": "any", "reason": reason}]
    }
    line = _line(_text(summary_table(inputs["accuracy"], speed, inputs["winner"], None)), "onnx-fp32")
    assert "pass cosine" in line and "not timed: its faster twin onnx-optimized-fp32" in line, line
    assert "not runnable" not in line


def test_a_failing_lower_bound_reads_below_its_threshold(inputs):
    """neighbours is a lower bound like cosine: a failure is a value under the threshold."""
    import copy

    accuracy = copy.deepcopy(inputs["accuracy"])
    entry = accuracy["artifacts"]["onnx-int8"]
    entry["checks"] = [
        {
            "output": "pooled",
            "inputs": "data",
            "metric": "neighbours",
            "value": 0.5,
            "threshold": 0.9,
            "passed": False,
            "runtime": "onnxruntime-cpu",
        }
    ]
    text = _text(summary_table(accuracy, inputs["speed"], inputs["winner"], None))
    assert "FAIL neighbours 0.5" in _line(text, "onnx-int8") and "< 0.9" in _line(text, "onnx-int8")


def test_an_opt_in_runtime_left_out_names_no_timed_artifact(inputs):
    """An opt-in runtime the recipe does not list is named under "Not timed", never as the note of an
    artifact that has rows on other runtimes."""
    import copy

    speed = copy.deepcopy(inputs["speed"])
    timing = speed.setdefault("conditions", {}).setdefault("runtimes_timed", {})
    timing["not_timed"] = [
        {
            "artifact": "onnx-fp32",
            "runtime": "openvino-cpu",
            "io": "any",
            "reason": "an opt-in runtime; list it",
        }
    ]
    text = _text(summary_table(inputs["accuracy"], speed, inputs["winner"], None))
    assert "opt-in" not in text


def test_inputs_of_several_shapes_head_the_column_one_per_line(inputs):
    """An encoder-decoder's three inputs: the accuracy verdicts stay whole on their line at 160 columns (the
    shapes on the header's single line widened the figure column until they folded to a few letters a line)."""
    for row in inputs["speed"]["results"]:
        batch = row["batch"]
        row["shapes"] = {
            "input_ids": [batch, 32],
            "attention_mask": [batch, 32],
            "decoder_input_ids": [batch, 8],
        }
    text = _text(summary_table(inputs["accuracy"], inputs["speed"], inputs["winner"], 1), width=160)
    header = [line.strip("┃ ") for line in text.splitlines() if line.startswith("┃")]
    for part in ("batch 1", "input_ids 1×32", "attention_mask 1×32", "decoder_input_ids 1×8"):
        assert any(line.endswith(part) or f" {part} ┃" in line for line in header), (part, header)
    assert "pass cosine 0.986200" in _line(text, "★ onnx-int8-dynamic")
    assert "10.8 / 12.5" in _line(text, "★ onnx-int8-dynamic")
