from __future__ import annotations

from pipeline.report.facts import fmt_ms
from pipeline.report.markdown import escape, render_markdown
from tests.unit.report import samples


def _section(text: str, title: str) -> str:
    start = text.index(f"## {title}")
    end = text.find("\n## ", start + 1)
    return text[start : end if end > 0 else None]


def _folded(text: str, title: str) -> str:
    start = text.index(f"<summary><b>{title}</b></summary>")
    return text[start : text.index("</details>", start)]


def test_verdict_comes_first_and_winner_is_named(inputs):
    text = render_markdown(**inputs)
    assert text.startswith("# Sign-off: bert v0003")
    assert text.index("**SIGNED OFF**") < text.index("## Winner") < text.index("## Accuracy")
    winner = _section(text, "Winner")
    assert "onnx-int8-dynamic on onnxruntime-cpu (host I/O): 10.8 ms" in winner
    assert "Runner-up: onnx-fp16 on onnxruntime-cpu at 30.2 ms (the winner is 2.80× faster)" in winner
    assert "does not overlap the runner-up" in winner
    assert "2.93× faster than onnx-fp32 (onnxruntime-cpu) at cosine 0.986200 vs 0.9999999." in winner
    assert "File: model.int8-dynamic.onnx" in winner and "(95% interval 10.7–10.9)" in winner
    assert "artifacts.onnx-int8-dynamic.runtimes.onnxruntime-cpu" in winner


def test_failed_sign_off_gives_reasons_and_no_winner(inputs):
    inputs["header"] = samples.header(signed_off=False)
    inputs["winner"] = None
    text = render_markdown(**inputs)
    verdict = _section(text, "Verdict")
    assert "**NOT SIGNED OFF: nothing may be deployed from this version**" in verdict
    assert "| ship | nothing: no artifact was selected |" in verdict
    assert "- no artifact passed validation" in verdict
    assert "No artifact was selected" in _section(text, "Winner")
    assert "★" not in text


def test_accuracy_table_shows_failing_artifact_and_its_reason(inputs):
    acc = _section(render_markdown(**inputs), "Accuracy")
    row = next(line for line in acc.splitlines() if line.startswith("| onnx-int8 |"))
    assert "| FAIL |" in row
    assert "0.971200 \\< 0.98 ✗" in row
    assert "cosine 0.971200 \\< 0.98 on sentence_embedding @ data" in row
    assert "- onnx-int8: sentence_embedding @ data: cosine 0.971200 \\< 0.98 ✗" in acc
    fp16 = next(line for line in acc.splitlines() if line.startswith("| onnx-fp16 |"))
    # an informational miss does not gate: no ✗, marked (info), on a passing row
    assert "| pass |" in fp16 and "0.061 > 0.05 (info)" in fp16 and "✗" not in fp16


def test_accuracy_table_shows_a_neighbours_share_true_to_its_number(inputs):
    """A hold-out's FP16 kept 0.9995 of its embeddings' neighbours; three significant figures showed 0.999."""
    from tests.claims import accuracy_table_problems

    neighbours = {"output": "sentence_embedding", "inputs": "data", "metric": "neighbours", "value": 0.9995}
    neighbours |= {"threshold": None, "passed": True, "informational": True}
    inputs["accuracy"]["artifacts"]["onnx-fp16"]["checks"].append(neighbours)
    text = render_markdown(**inputs)
    fp16 = next(line for line in _section(text, "Accuracy").splitlines() if line.startswith("| onnx-fp16 |"))
    assert "| 0.999500 (info) |" in fp16
    assert accuracy_table_problems(text, inputs["accuracy"]) == []


def test_speed_table_marks_winner_and_unstable_row(inputs):
    speed = _section(render_markdown(**inputs), "Speed")
    lines = speed.splitlines()
    winner_rows = [line for line in lines if "★" in line and line.startswith("|")]
    assert (
        len(winner_rows) == 1
        and "| onnx-int8-dynamic ★ | onnxruntime-cpu | host | 1 | 1×128 | 10.8 |" in winner_rows[0]
    )
    unstable = next(line for line in lines if line.startswith("| onnx-fp16 |") and "| 8 |" in line)
    assert unstable.endswith("| NO: window medians spread 12.0% over the last 3 windows (limit 5%) |")
    assert "182–186" in unstable
    assert "never had their window medians agree" in speed


def test_throughput_winner_and_the_columns_of_throughput_and_memory(inputs):
    """A throughput objective: the winner's figure, runner-up and baseline read in sequences/s and as shares of
    throughput; the speed table gains seq/s (with its interval) and peak MiB where rows measured them."""
    rows = inputs["speed"]["results"]
    for row in rows:
        if row["batch"] == 8 and row["artifact"] != "torch-fp32":
            rate = 8000 / row["p50_ms"]
            row["throughput"] = {"sequences_per_s": rate, "ci95": [rate * 0.98, rate * 1.02], "stable": True}
            row["peak_memory"] = {"bytes": 96 * 2**20}
    winner = inputs["winner"]
    winner |= {"objective": {"metric": "sequences_per_s", "batch": 8}, "unit": "seq/s", "value": 121.4}
    winner |= {"interval": [119.0, 123.8]}
    winner["runner_up"] |= {"value": 43.4}
    winner["baseline"] |= {"value": 41.5}
    text = render_markdown(**inputs)
    won = _section(text, "Winner")
    assert "onnx-int8-dynamic on onnxruntime-cpu (host I/O): 121 seq/s (95% interval 119–124)" in won, won
    assert "Runner-up: onnx-fp16 on onnxruntime-cpu at 43 seq/s (the winner has 2.80× its throughput)" in won
    assert "2.93× the throughput of onnx-fp32 (onnxruntime-cpu)" in won
    speed = _section(text, "Speed")
    assert "| seq/s | seq/s 95% CI | peak MiB |" in speed
    marked = next(line for line in speed.splitlines() if "★" in line)
    assert "| onnx-int8-dynamic ★ | onnxruntime-cpu | host | 8 |" in marked
    assert marked.endswith("| 121 | 119–124 | 96 |")
    reference = next(
        line for line in speed.splitlines() if line.startswith("| torch-fp32 |") and "| 8 |" in line
    )
    assert reference.endswith("| — | — | — |")
    assert "not derived from the latencies" in speed


def test_not_run_flags_stages_and_environment(inputs):
    text = render_markdown(**inputs)
    not_run = _section(text, "Not run")
    assert "tensorrt-rtx-fp16" in not_run
    assert "no TensorRT-RTX runtime for this machine: no GPU (cudaError 35 \\<driver>)" in not_run
    assert "validation, benchmark" in not_run
    flags = _section(text, "Flags")
    assert (
        "- int8 not faster: onnx-int8 (onnxruntime-cpu) batch 1, shape 1×128: onnx-int8 p50 36.100 ms"
        in flags
    )
    assert "- unstable: onnx-fp16 (onnxruntime-cpu) batch 8, shape 8×128: stopped by max_windows" in flags
    stages = _folded(text, "Stages")
    assert (
        "| int8_entropy | failed | 3.1 s | calibration failed: Too many bins for data range \\<x> |" in stages
    )
    assert "Traceback (most recent call last)" in stages  # the full error, in a code block, unescaped
    assert "TracerWarning" in stages
    conditions = _folded(text, "Conditions")  # one table: the benchmark's conditions and the environment
    assert "| benchmark.intra_op_threads | 2 |" in conditions
    assert "| environment.onnxruntime.providers | CPUExecutionProvider |" in conditions
    assert "Environment" not in text.replace("environment.", "")


def test_changes_section_from_previous_version(inputs):
    text = render_markdown(**inputs, previous=samples.previous())
    changes = _section(text, "Changes since v0002")
    assert "onnx-fp32 batch 1 p50 34.7 -> 31.6 ms (-9%)" in changes
    assert "winner onnx-fp32 (onnxruntime-cpu, host I/O) -> onnx-int8-dynamic" in changes
    assert "onnx-int8 accuracy pass -> FAIL" in changes
    assert "Changes since" not in render_markdown(**inputs)


def test_plots_are_linked_relative_to_reports(inputs):
    text = render_markdown(**inputs, plots=["reports/latency.png", "reports/accuracy.png"])
    assert "](latency.png)" in text and "](accuracy.png)" in text
    assert "](reports/" not in text


def test_escape_keeps_markdown_inert():
    assert escape("a<b>|c*d") == "a\\<b>\\|c\\*d"
    assert escape("versions.tensorrt[0]") == "versions.tensorrt[0]"
    assert escape("input_ids") == "input_ids"
    assert escape("__init__") == "\\_\\_init\\_\\_"


def test_empty_inputs_render(inputs):
    text = render_markdown(inputs["header"], None, None, None, [])
    assert "**SIGNED OFF**" in text and "## Speed" not in text


def test_same_inputs_same_text(inputs):
    assert render_markdown(**inputs, previous=samples.previous()) == render_markdown(
        **inputs, previous=samples.previous()
    )


def test_failures_and_warnings_come_first_in_the_verdict(inputs):
    header = samples.header()
    header.update(
        requested=["onnx-fp32", "onnx-fp16", "onnx-optimized-fp32", "onnx-int8"],
        failed=[
            {
                "artifact": "onnx-optimized-fp32",
                "stage": "optimize_onnx_fp32",
                "error": "FileNotFoundError: x",
            },
            {"artifact": "onnx-int8", "stage": "validate", "error": "cosine 0.97 < 0.98"},
        ],
        warnings=["dims.sequence.min is not validated (validation.corners leaves out min)"],
        provisional=True,
    )
    text = render_markdown(**(inputs | {"header": header}))
    verdict = _section(text, "Verdict")
    assert "2 of 4 requested variants failed." in verdict
    assert "| onnx-optimized-fp32 | optimize_onnx_fp32 | FileNotFoundError: x |" in verdict
    assert "- dims.sequence.min is not validated" in verdict
    assert "Provisional: winner did not stabilize. Its latency is a spread" in verdict
    assert text.index("Failed variants") < text.index("## Winner")
    # under a throughput objective what did not settle is the throughput (a hold-out Llama's page said latency)
    winner = inputs["winner"] | {"objective": {"metric": "sequences_per_s", "batch": 1}}
    text = render_markdown(**(inputs | {"header": header, "winner": winner}))
    assert "Provisional: winner did not stabilize. Its throughput is a spread" in _section(text, "Verdict")


def test_the_record_is_folded(inputs):
    text = render_markdown(**inputs)
    for title in ("Artifacts", "Stages", "Conditions"):
        assert f"<details>\n<summary><b>{title}</b></summary>" in text
        assert f"## {title}" not in text


def test_the_revision_says_when_the_code_is_not_that_commit(inputs):
    header = samples.header() | {"git_dirty": True}
    text = render_markdown(**(inputs | {"header": header}))
    assert "git revision abc1234 with uncommitted changes to the pipeline's code" in text.splitlines()[2]


def test_a_simpler_winner_tied_with_a_faster_runner_up_is_not_called_faster(inputs):
    """The tie-break picks the simplest of candidates within noise: the runner-up's p50 may be the lower one,
    and 'the winner is 0.94× faster' would read as the opposite of what was measured."""
    inputs["winner"]["runner_up"]["value"] = 10.2  # the winner's is 10.8
    winner = _section(render_markdown(**inputs), "Winner")
    assert "at 10.2 ms (the winner is 1.06× slower by p50; see Why)" in winner, winner
    assert "× faster)" not in winner


def test_a_speed_ratio_is_claimed_only_where_the_intervals_separate(inputs):
    """'1.28× faster than onnx-fp32' was printed while the two intervals overlapped."""
    inputs["winner"]["baseline"] |= {"value": 13.8, "interval": [10.8, 16.0]}  # overlaps [10.7, 10.9]
    inputs["winner"]["runner_up"] |= {"value": 11.0, "interval": [10.85, 11.2]}
    winner = _section(render_markdown(**inputs), "Winner")
    assert "× faster than onnx-fp32" not in winner and "Within noise of onnx-fp32 (onnxruntime-cpu)" in winner
    assert "(within noise of the winner: 95% intervals overlap; see Why)" in winner
    inputs["winner"]["baseline"] |= {"interval": [13.5, 14.1]}
    winner = _section(render_markdown(**inputs), "Winner")
    assert "1.28× faster than onnx-fp32 (onnxruntime-cpu)" in winner


def test_a_ratio_against_a_row_that_did_not_settle_says_so(inputs):
    """A hold-out sign-off read '470.80× faster than torchscript-fp32' against a row whose windows never
    agreed (measured alone, 1.6×): a ratio against an unsettled row is marked rough."""
    inputs["winner"]["baseline"]["stable"] = False
    inputs["winner"]["runner_up"] |= {"value": 11.5, "interval": [11.2, 11.9], "stable": False}
    winner = _section(render_markdown(**inputs), "Winner")
    assert "2.93× faster than onnx-fp32 (onnxruntime-cpu)" in winner
    assert "onnx-fp32's timing did not settle, so the ratio is rough" in winner, winner
    assert "that row's timing did not settle)" in winner, winner
    inputs["winner"]["baseline"]["stable"] = True
    inputs["winner"]["runner_up"]["stable"] = True
    winner = _section(render_markdown(**inputs), "Winner")
    assert "did not settle" not in winner


def test_not_run_sits_under_the_verdict_and_flags_are_grouped(inputs):
    text = render_markdown(**inputs)
    titles = [line for line in text.splitlines() if line.startswith("## ")]
    assert titles[:3] == ["## Verdict", "## Not run", "## Winner"]
    flags = _section(text, "Flags")
    assert "**int8 not faster (1)**" in flags and "**unstable (1)**" in flags


def test_the_winners_cost_quotes_a_metric_that_gates(inputs):
    """A hold-out's one value per sample: cosine cannot judge it and only informs, max_abs gates, and the
    winner's line said 'at cosine 1.000000 vs 1.000000'."""
    inputs["winner"]["accuracy"]["gating"] = ["max_abs"]
    inputs["winner"]["baseline"]["accuracy"] = {"cosine": 1.0, "max_abs": 3.4e-6}
    winner = _section(render_markdown(**inputs), "Winner")
    assert "faster than onnx-fp32 (onnxruntime-cpu) at max_abs 0.33 vs" in winner, winner
    inputs["winner"]["accuracy"]["gating"] = ["cosine"]
    assert "at cosine 0.986200 vs" in _section(render_markdown(**inputs), "Winner")


def test_the_speed_table_shows_the_statistic_selection_ranked_by(inputs):
    """A hold-out Swin ranked by p90: the Winner section quoted p90 figures the Speed table did not show."""
    text = render_markdown(**inputs)
    assert "p90 ms" not in _section(text, "Speed")  # p50 and p99 are always there
    winner = inputs["winner"] | {"objective": {**inputs["winner"]["objective"], "metric": "p90_ms"}}
    speed = _section(render_markdown(**(inputs | {"winner": winner})), "Speed")
    assert "| p90 ms | p90 95% CI ms |" in speed
    row = next(r for r in inputs["speed"]["results"] if r["artifact"] == "onnx-fp32" and r["batch"] == 1)
    line = next(x for x in speed.splitlines() if x.startswith("| onnx-fp32 ") and "| 1 |" in x)
    assert f"| {fmt_ms(row['p90_ms'])} |" in line, line


def test_the_accuracy_section_says_where_each_failing_graph_diverges_or_that_no_node_was_found(inputs):
    """A search that found no single node said nothing on the page: a failure with no line there read as
    never searched."""
    verdict = {"passed": False, "reason": "cosine 0.971200 < 0.98 on sentence_embedding @ data"}
    int8 = inputs["accuracy"]["artifacts"]["onnx-int8"]
    note = "no ONNX node output exceeds the tolerance on the CPU provider"
    int8["runtimes"] = {"onnxruntime-cpu": {**verdict, "divergence": {"text": None, "note": note}}}
    acc = _section(render_markdown(**inputs), "Accuracy")
    assert "Where failing artifacts first diverge from the FP32 ONNX graph:" in acc
    assert f"- onnx-int8 on onnxruntime-cpu: {note}" in acc
    located = "first diverges at node_MatMul_7 (MatMul, encoder.layer.1) output t: cosine 0.5 \\< 0.98"
    int8["runtimes"]["onnxruntime-cpu"]["divergence"] = {"text": located.replace("\\<", "<")}
    assert f"- onnx-int8 on onnxruntime-cpu: {located}" in _section(render_markdown(**inputs), "Accuracy")
    int8["runtimes"]["onnxruntime-cpu"]["divergence"] = {"text": None, "error": "InvalidGraph: bad"}
    acc = _section(render_markdown(**inputs), "Accuracy")
    assert "- onnx-int8 on onnxruntime-cpu: not located, the search failed: InvalidGraph: bad" in acc
