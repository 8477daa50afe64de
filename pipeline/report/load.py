"""The report's Load section (benchmark.scenarios holds server): for each candidate that ran MLPerf's Server
scenario, the highest rate it serves within the p99 target, with its interval over repeated LoadGen runs, and
whether the winner by the objective is also the one that serves the most."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pipeline.check.served import ServedRate, served_rates
from pipeline.check.speed import SERVED, fmt_ms, fmt_qps, overlap
from pipeline.report.blocks import Block, Cell, Image, Para, Section, Table, Text

Dict = Mapping[str, Any]


def load_section(load: Dict | None, winner: Dict | None, image: str | None) -> Section:
    rows = served_rates(load)
    if not rows:
        return Section("Load", [])
    conditions = (load or {}).get("conditions") or {}
    target = float(conditions.get("p99_ms") or 0)
    blocks: list[Block] = [
        Para(_how(load or {}, target)),
        Table(
            ["artifact", "runtime", "through", f"requests/s at p99 ≤ {target:g} ms", "95% interval", "held"]
            + ["LoadGen", "note"],
            [_cells(row) for row in rows],
            ["bad" if row.max_qps is None else "" for row in rows],
        ),
    ]
    sentence = _winner_sentence(rows, winner)
    if sentence:
        blocks.append(Para(sentence, strong=True))
    blocks += [Para(text) for row in rows if (text := _split_sentence(row))]
    blocks.append(
        Para(
            "LoadGen's own verdict (VALID/INVALID) is kept with each candidate's logs under reports/loadgen/: short "
            "runs are usually INVALID by MLPerf's early-stopping rule, which needs hundreds of requests to bound "
            "the p99; the rate above is judged on the measured p99 itself.",
            tone="note",
        )
    )
    if image:
        blocks.append(
            Image(image, "Server scenario: p99 latency against requests per second, with the target")
        )
    return Section("Load", blocks)


def _how(load: Dict, target: float) -> str:
    """How the rates were measured, in the words of this report's own settings."""
    conditions = load.get("conditions") or {}
    batcher = (
        "served by a real Triton server on localhost, LoadGen's requests sent over gRPC, Triton's dynamic batcher "
        if load.get("through") == "triton"
        else "behind a dynamic batcher in the deploy's process "
    )
    return (
        f"MLPerf LoadGen's Server scenario: the recipe's {conditions.get('requests', '?')} validation samples arrive "
        f"at random (Poisson) times, each candidate {batcher}(batches of at most {conditions.get('max_batch', '?')}, "
        f"a request held at most {conditions.get('max_queue_delay_ms', '?')} ms for a fuller batch), in "
        f"{conditions.get('run_s', '?')} s runs. A request's latency runs from its arrival to its answer: queueing, "
        "the wait for a batch, padding, copies and inference. The rate is searched run by run for the highest "
        f"whose p99 stays within {target:g} ms, then run again: it stands when most of those runs hold the target, "
        "and the figure is their mean completed rate with its 95% interval. ≥ marks a rate the search never saw "
        "fail: the candidate may serve more."
    )


def _cells(row: ServedRate) -> list[Text]:
    note = row.error or row.missed or ""
    held = f"{row.held}/{row.repeats}" if row.repeats else "—"
    span = f"{fmt_qps(row.ci95[0])}–{fmt_qps(row.ci95[1])}" if row.ci95 else "—"
    shown = ("≥ " if row.bounded else "") + fmt_qps(row.max_qps)
    figure: Text = shown if row.max_qps is not None else Cell("none met", "bad")
    through = "Triton" if row.through == "triton" else "in process"
    return [row.artifact, row.runtime, through, figure, span, held, row.loadgen_result or "—", note]


def _split_sentence(row: ServedRate) -> str | None:
    """Where a request's time went at the lowest rate tried (the serving path's own cost): in the deploy's
    batcher, or through Triton by its own counters, so that a served figure far from the in-process one says
    which step took the difference."""
    split = row.split
    if split is None:
        return None
    p50 = (
        f"; LoadGen's p50 from issue to answer was {fmt_ms(split.p50_ms)} ms"
        if split.p50_ms is not None
        else ""
    )
    where = f"for {row.label} at {fmt_qps(split.target_qps)} requests/s (the lowest rate tried)"
    if split.compute_infer_ms is None or split.server_ms is None:
        call = f" and {fmt_ms(split.runner_ms)} ms in its batch's call" if split.runner_ms is not None else ""
        return (
            f"In the deploy's batcher, {where}, a request waited on average {fmt_ms(split.queue_ms)} ms in the "
            f"queue (the batch wait included){call}{p50}."
        )
    parts = [f"{fmt_ms(split.queue_ms)} ms in Triton's queue (its batcher's wait included)"]
    if split.runner_ms is not None:
        handoff = max(split.compute_infer_ms - split.runner_ms, 0.0)
        parts.append(
            f"{fmt_ms(split.compute_infer_ms)} ms in the compute step: {fmt_ms(split.runner_ms)} ms in the runner "
            f"itself, {fmt_ms(handoff)} ms in the Python backend's hand-off to the deploy's process and back"
        )
    else:
        parts.append(f"{fmt_ms(split.compute_infer_ms)} ms in the compute step")
    rest = f"{p50} (the client and gRPC take the rest)" if p50 else ""
    return (
        f"Inside the server, {where}, a request spent on average {'; '.join(parts)}; "
        f"{fmt_ms(split.server_ms)} ms in the server in all{rest}."
    )


def _winner_sentence(rows: list[ServedRate], winner: Dict | None) -> str | None:
    """One sentence: whether the winner by the objective also serves the most within the target (under the
    served-rate objective: whether the fastest single request is also the server winner)."""
    serving = [r for r in rows if r.max_qps is not None]
    if not serving:
        return "No candidate held the p99 target at any rate tried: the notes say why, for each."
    if winner and (winner.get("objective") or {}).get("metric") == SERVED:
        return _single_stream_sentence(winner)
    best = max(serving, key=lambda r: r.max_qps or 0.0)
    if not winner:
        return f"{best.label} serves the most within the target: {fmt_qps(best.max_qps)} requests/s."
    mine = next((r for r in rows if r.artifact == winner.get("artifact")), None)  # its runtime without graphs
    if mine is None:
        return (
            f"The winner by the objective, {winner.get('artifact')} ({winner.get('runtime')}), was not run under "
            f"load; {best.label} serves the most of those that were: {fmt_qps(best.max_qps)} requests/s."
        )
    if mine is best:
        return f"The winner, {best.label}, also serves the most within the target: {fmt_qps(best.max_qps)} requests/s."
    if mine.max_qps is not None and overlap(mine.ci95, best.ci95):
        return (
            f"The winner, {mine.label}, serves {fmt_qps(mine.max_qps)} requests/s within the target, within noise "
            f"of the most ({best.label}, {fmt_qps(best.max_qps)}; 95% intervals overlap)."
        )
    if mine.max_qps is not None:
        theirs = f"{fmt_qps(mine.max_qps)} requests/s"
    else:
        theirs = "nothing: its load run failed (see its note)" if mine.error else "no rate within the target"
    return (
        f"The winner by the objective, {mine.label}, serves {theirs}; {best.label} serves the most under load: "
        f"{fmt_qps(best.max_qps)} requests/s."
    )


def _single_stream_sentence(winner: Dict) -> str:
    label = f"{winner.get('artifact')} ({winner.get('runtime')})"
    fastest = winner.get("single_stream")
    if not fastest:
        return f"The server winner is {label}; no single-stream row was there to compare it with."
    p50 = f"p50 {fmt_ms(fastest.get('p50_ms'))} ms"
    if fastest.get("same"):
        return f"The server winner, {label}, is also the fastest single request, at {p50}."
    return (
        f"The fastest single request, {fastest.get('label')} at {p50}, is not the server winner: {label} serves "
        f"the most within the target, {fmt_qps(winner.get('value'))} requests/s."
    )
