"""Selection: objective shape, per-runtime accuracy, the objective metric's own interval, the simplest of the
tied, and reasons that tell the truth (on report dicts as the stages write them)."""

from __future__ import annotations

from pathlib import Path

from pipeline.check.timings import Timing
from pipeline.check.verdicts import AccuracyRecord
from pipeline.decide.selection import (
    SelectionPolicy,
    choose,
    selection_problems,
    tied,
    unsettled_contenders,
)
from pipeline.decide.served import choose_served
from pipeline.recipe.loader import load

ROOT = Path(__file__).resolve().parents[2]


def _row(
    artifact: str,
    p50: float,
    ci: tuple[float, float],
    seq: int = 16,
    batch: int = 1,
    runtime: str = "onnxruntime-cpu",
    **extra: object,
) -> dict:
    return {
        "artifact": artifact,
        "runtime": runtime,
        "io": "host",
        "batch": batch,
        "sequence_length": seq,
        "shapes": {"input_ids": [batch, seq]},
        "p50_ms": p50,
        "p99_ms": p50 * 2,
        "p50_ci95_ms": list(ci),
        "ci95_ms": {"p50": list(ci)},
        "stable": True,
        **extra,
    }


def _entry(passed: bool, runtimes: dict[str, bool] | None = None) -> dict:
    runtimes = runtimes or {"onnxruntime-cpu": passed}
    return {
        "passed": passed,
        "reason": None if passed else "x",
        "runtimes": {rt: {"passed": ok, "reason": None if ok else "x"} for rt, ok in runtimes.items()},
        "checks": [
            {"output": "pooled", "inputs": "data", "metric": "cosine", "value": 0.99, "runtime": rt}
            for rt in runtimes
        ],
    }


ACCURACY = {
    "artifacts": {
        "onnx-fp32": _entry(True),
        "onnx-int8": _entry(True),
        "onnx-fp16": _entry(False),
        "onnx-optimized-fp32": _entry(True),
    }
}


def _recipe(*overrides: str) -> SelectionPolicy:
    recipe = load(ROOT / "tests/recipes/tiny.yaml", ["benchmark.sequence_lengths=[8,16]", *overrides]).recipe
    return SelectionPolicy.from_recipe(recipe)


def test_fastest_passing_artifact_wins_when_beyond_noise() -> None:
    speed = {
        "results": [
            _row("onnx-fp32", 10, (9.5, 10.5)),
            _row("onnx-int8", 5, (4.8, 5.2)),
            _row("onnx-fp16", 1, (0.9, 1.1)),  # failed validation: never a candidate
        ]
    }
    winner = choose(_recipe(), speed, ACCURACY, {"onnx-int8": "model.int8.onnx"})
    assert winner["artifact"] == "onnx-int8" and winner["runner_up"]["artifact"] == "onnx-fp32"
    assert winner["file"] == "model.int8.onnx" and winner["within_noise_of"] == []
    assert "do not overlap" in winner["reason"] and winner["accuracy"]["passed"] is True
    assert winner["accuracy"]["figures"] == {"cosine": 0.99}
    assert winner["baseline"]["artifact"] == "onnx-fp32"


def test_within_noise_the_simpler_artifact_wins_and_says_so() -> None:
    """Fastest is not the simplest: the simplest of those tied with the fastest wins."""
    speed = {"results": [_row("onnx-fp32", 10, (9.0, 11.0)), _row("onnx-int8", 9.8, (9.5, 10.5))]}
    winner = choose(_recipe(), speed, ACCURACY)
    assert winner["artifact"] == "onnx-fp32"
    assert "within noise" in winner["reason"] and "simplest" in winner["reason"]
    assert winner["within_noise_of"] == ["onnx-int8 (onnxruntime-cpu)"]
    assert "do not overlap" not in winner["reason"]


def test_fastest_and_simplest_but_overlapping_never_claims_separation() -> None:
    """The CNN case from review: the winner's interval overlaps another; the reason must say so."""
    speed = {
        "results": [
            _row("onnx-fp32", 1.2437, (1.2319, 1.2526)),
            _row("onnx-optimized-fp32", 1.2420, (1.2374, 1.2471)),
        ]
    }
    winner = choose(_recipe(), speed, ACCURACY)
    assert winner["artifact"] == "onnx-fp32"  # simplest of the tied, though not the fastest
    assert "overlap" in winner["reason"] and "do not overlap" not in winner["reason"]
    speed["results"][1]["artifact"] = "onnx-int8"
    speed["results"][0]["p50_ms"] = 1.2400  # now onnx-fp32 is the fastest and the simplest, still overlapping
    winner = choose(_recipe(), speed, ACCURACY)
    assert winner["artifact"] == "onnx-fp32" and "within noise of onnx-int8" in winner["reason"]
    assert "do not overlap" not in winner["reason"]


def test_p99_objective_uses_the_p99_interval() -> None:
    rows = [
        _row("onnx-fp32", 10, (9.9, 10.1), p99_ms=30.0, ci95_ms={"p50": [9.9, 10.1], "p99": [20.0, 40.0]}),
        _row("onnx-int8", 12, (11.9, 12.1), p99_ms=25.0, ci95_ms={"p50": [11.9, 12.1], "p99": [24.0, 26.0]}),
    ]
    recipe = _recipe("selection.objective.metric=p99_ms")
    a, b = (Timing.read(r) for r in rows)
    assert tied(a, b, "p99_ms") and not tied(a, b, "p50_ms")
    winner = choose(recipe, {"results": rows}, ACCURACY)
    # by p99 onnx-int8 is faster, but the p99 intervals overlap: the simpler onnx-fp32 wins
    assert winner["artifact"] == "onnx-fp32" and winner["interval"] == [20.0, 40.0]
    assert "within noise" in winner["reason"] and "25.0 ms [24.0–26.0]" in winner["reason"]


def test_a_row_without_its_own_accuracy_record_is_never_selected() -> None:
    accuracy = {"artifacts": {"onnx-fp32": _entry(True), "onnx-int8": _entry(True)}}
    speed = {
        "results": [
            _row("onnx-fp32", 10, (9.5, 10.5)),
            _row("onnx-int8", 1, (0.9, 1.1), runtime="onnxruntime-cuda"),  # validated on the CPU only
        ]
    }
    winner = choose(_recipe(), speed, accuracy)
    assert winner["artifact"] == "onnx-fp32" and winner["runtime"] == "onnxruntime-cpu"
    accuracy["artifacts"]["onnx-int8"] = _entry(False, {"onnxruntime-cpu": False, "onnxruntime-cuda": True})
    winner = choose(_recipe(), speed, accuracy)
    assert winner["artifact"] == "onnx-int8" and winner["runtime"] == "onnxruntime-cuda"
    assert winner["accuracy"]["runtime"] == "onnxruntime-cuda" and winner["accuracy"]["passed"]


def test_unstable_winner_is_provisional_with_its_reason() -> None:
    speed = {
        "results": [
            _row("onnx-fp32", 10, (9.5, 10.5)),
            _row("onnx-int8", 5, (4.8, 5.2), stable=False, unstable_reason="window medians spread 12%"),
        ]
    }
    winner = choose(_recipe(), speed, ACCURACY)
    assert winner["provisional"] is True and winner["stable"] is False
    assert "provisional: winner did not stabilize (window medians spread 12%)" in winner["reason"]


def test_objective_sequence_length_is_honoured() -> None:
    speed = {"results": [_row("onnx-int8", 1, (0.9, 1.1), seq=8), _row("onnx-fp32", 10, (9.5, 10.5), seq=16)]}
    assert (
        choose(_recipe("selection.objective.sequence_length=16"), speed, ACCURACY)["artifact"] == "onnx-fp32"
    )
    assert choose(_recipe(), speed, ACCURACY)["artifact"] == "onnx-int8"  # default: the shortest benchmarked


def test_selection_problems_name_what_is_missing() -> None:
    assert selection_problems({"artifacts": {"a": _entry(False)}}, None) == ["no artifact passed validation"]
    assert "no artifact that passed validation" in selection_problems(ACCURACY, None)[0]
    assert selection_problems(ACCURACY, {"artifact": "onnx-fp32"}) == []


def test_accuracy_figures_are_the_gating_ones_as_in_the_table() -> None:
    from pipeline.decide.selection import accuracy_record

    entry = _entry(True)
    entry["checks"] = [
        {
            "output": "hidden",
            "metric": "cosine",
            "value": 0.95,
            "informational": True,
            "runtime": "onnxruntime-cpu",
        },
        {
            "output": "pooled",
            "metric": "cosine",
            "value": 0.989,
            "informational": False,
            "runtime": "onnxruntime-cpu",
        },
        {
            "output": "pooled",
            "metric": "max_abs",
            "value": 0.5,
            "informational": True,
            "runtime": "onnxruntime-cpu",
        },
        {
            "output": "hidden",
            "metric": "max_abs",
            "value": 0.9,
            "informational": True,
            "runtime": "onnxruntime-cpu",
        },
    ]
    row = Timing.read({"artifact": "a", "runtime": "onnxruntime-cpu"})
    figures = accuracy_record(AccuracyRecord.read("a", entry), row.artifact, row.runtime)["figures"]
    assert figures == {"cosine": 0.989, "max_abs": 0.9}


def _throughput(row: dict, rate: float, ci: tuple[float, float], stable: bool = True) -> dict:
    return row | {"throughput": {"sequences_per_s": rate, "ci95": list(ci), "stable": stable}}


def test_throughput_objective_picks_the_highest_rate_beyond_noise() -> None:
    """sequences_per_s is maximized: the row with the most sequences/s wins, though another has the lower
    latency; a row without a throughput run is no candidate; the reason and unit say throughput."""
    recipe = _recipe("selection.objective.metric=sequences_per_s", "selection.objective.batch=2")
    speed = {
        "results": [
            _throughput(_row("onnx-fp32", 10, (9.5, 10.5), batch=2), 900.0, (880.0, 920.0)),
            _throughput(_row("onnx-int8", 8, (7.8, 8.2), batch=2), 700.0, (690.0, 710.0)),
            _row("onnx-optimized-fp32", 1, (0.9, 1.1), batch=2),  # no throughput run: not a candidate
        ]
    }
    winner = choose(recipe, speed, ACCURACY)
    assert winner["artifact"] == "onnx-fp32" and winner["unit"] == "seq/s" and winner["value"] == 900.0
    assert winner["interval"] == [880.0, 920.0] and winner["runner_up"]["artifact"] == "onnx-int8"
    assert winner["runner_up"]["value"] == 700.0
    assert winner["reason"].startswith("highest sequences/s: 900 seq/s [880–920] vs 700 seq/s [690–710]")
    assert "do not overlap" in winner["reason"] and not winner["provisional"]


def test_throughput_objective_ties_go_to_the_simpler_and_unstable_runs_are_provisional() -> None:
    recipe = _recipe("selection.objective.metric=sequences_per_s")
    speed = {
        "results": [
            _throughput(_row("onnx-fp32", 10, (9.5, 10.5)), 100.0, (95.0, 105.0)),
            _throughput(_row("onnx-int8", 5, (4.8, 5.2)), 103.0, (99.0, 107.0), stable=False),
        ]
    }
    winner = choose(recipe, speed, ACCURACY)
    assert winner["artifact"] == "onnx-fp32" and winner["within_noise_of"] == ["onnx-int8 (onnxruntime-cpu)"]
    assert "within noise" in winner["reason"] and not winner["provisional"] and winner["stable"]
    # the simpler run unsettled, the fastest settled: no tie, the fastest wins
    speed["results"][0]["throughput"]["stable"] = False
    speed["results"][1]["throughput"]["stable"] = True
    winner = choose(recipe, speed, ACCURACY)
    assert winner["artifact"] == "onnx-int8" and winner["within_noise_of"] == []
    # both unsettled: the simplest of those overlapping the fastest, provisionally
    speed["results"][1]["throughput"]["stable"] = False
    winner = choose(recipe, speed, ACCURACY)
    assert winner["artifact"] == "onnx-fp32" and winner["provisional"] and not winner["stable"]
    assert "throughput segments disagree" in winner["reason"]


def test_a_row_that_never_settled_does_not_tie_with_a_settled_fastest() -> None:
    """A hold-out's TorchScript row, its calls 1.7 ms and then 164 ms while another process took the CPU, had a
    p50 of 5.7 ms in [1.28, 172]: it overlapped the fastest row (1.26 ms [1.21, 1.31]) and, simplest, won."""
    speed = {
        "results": [
            _row("onnx-fp32", 5.73, (1.28, 172.0), stable=False, unstable_reason="changed level"),
            _row("onnx-optimized-fp32", 1.26, (1.21, 1.31)),
        ]
    }
    winner = choose(_recipe(), speed, ACCURACY)
    assert winner["artifact"] == "onnx-optimized-fp32" and winner["within_noise_of"] == []
    assert not winner["provisional"] and "do not overlap" not in winner["reason"]  # they do overlap
    assert winner["reason"] == (
        "fastest by p50 at 1.26 ms [1.21–1.31]; its 95% interval overlaps only those of rows whose timing did "
        "not settle, which are not within noise of a settled fastest: onnx-fp32 (onnxruntime-cpu) 5.73 ms "
        "[1.28–172] (changed level)"
    )
    # before selection the benchmark measures the unsettled simpler row again, with the fastest
    contenders = unsettled_contenders(_recipe(), speed, ACCURACY)
    assert [r.artifact for r in contenders] == ["onnx-fp32", "onnx-optimized-fp32"]


def test_a_row_a_simpler_row_beats_does_not_win_a_tie_for_its_simplicity() -> None:
    """A hold-out BEiT: `onnx-fp16` overlapped the fastest (`onnx-optimized-fp16`) and, simpler, won, though
    `onnx-fp32`, simpler still, was faster and within its noise (not the fastest's): the report then said the
    winner was within noise of a simpler, faster plain export."""
    speed = {
        "results": [
            _row("onnx-optimized-fp16", 0.594, (0.364, 0.684)),
            _row("onnx-optimized-fp32", 0.649, (0.618, 0.681), stable=False, unstable_reason="changed level"),
            _row("onnx-fp32", 0.748, (0.703, 0.806)),
            _row("onnx-fp16", 0.781, (0.564, 0.855)),
        ]
    }
    passed = {
        name: _entry(True)
        for name in ("onnx-optimized-fp16", "onnx-optimized-fp32", "onnx-fp32", "onnx-fp16")
    }
    winner = choose(_recipe(), speed, {"artifacts": passed})
    assert winner["artifact"] == "onnx-optimized-fp16" and winner["within_noise_of"] == []
    assert "do not overlap" not in winner["reason"]  # they do
    assert winner["reason"] == (
        "fastest by p50 at 0.594 ms [0.364–0.684]; the rows whose intervals overlap it cannot win a tie: "
        "onnx-optimized-fp32 (onnxruntime-cpu) 0.649 ms [0.618–0.681] (its timing did not settle: changed "
        "level); onnx-fp16 (onnxruntime-cpu) 0.781 ms [0.564–0.855] (beaten by the simpler onnx-fp32 "
        "(onnxruntime-cpu) at 0.748 ms [0.703–0.806])"
    )
    # where the fastest did not settle, the row measured again before selection is the one that will win: not a
    # simpler row beaten by a simpler one still (which, settled, asked for nothing and lost anyway)
    speed["results"] = [
        _row("onnx-optimized-fp16", 0.50, (0.30, 0.76), stable=False, unstable_reason="x"),
        _row("onnx-fp32", 0.78, (0.77, 0.79)),
        _row("onnx-fp16", 0.80, (0.75, 0.85)),
    ]
    contenders = unsettled_contenders(_recipe(), speed, {"artifacts": passed})
    assert [r.artifact for r in contenders][0] == "onnx-optimized-fp16"


def test_the_reason_names_exactly_the_tie_group_it_chose_from() -> None:
    """A plainer candidate that overlaps the winner but not the fastest is outside the tie group: listing it
    as 'within noise of the winner' would say it should have won."""
    speed = {
        "results": [
            _row("onnx-int8", 9.0, (8.8, 9.4)),  # the fastest
            _row("onnx-optimized-fp32", 9.3, (9.1, 9.7)),  # tied with the fastest, and simpler: the winner
            _row("onnx-fp32", 9.9, (9.6, 10.2)),  # overlaps the winner only: plainer, but not in the group
        ]
    }
    winner = choose(_recipe(), speed, ACCURACY)
    assert winner["artifact"] == "onnx-optimized-fp32"
    assert winner["within_noise_of"] == ["onnx-int8 (onnxruntime-cpu)"]
    assert "onnx-fp32 (onnxruntime-cpu)" not in winner["reason"]
    assert winner["reason"].startswith(
        "onnx-int8 (onnxruntime-cpu) measured 9.00 ms [8.80–9.40], within noise"
    )
    assert winner["reason"].endswith("the simplest of the candidates within noise of the fastest is chosen")


# A hold-out audio model's batch-1 rows as its deploy measured them (p50 and its 95% interval, ms)
AUDIO = [
    ("torchscript-fp32", "torchscript-cpu", 0.9480, (0.8668, 1.3644)),
    ("onnx-fp32", "onnxruntime-cpu", 0.6277, (0.6001, 0.6506)),
    ("onnx-fp16", "onnxruntime-cpu", 0.6193, (0.5894, 0.6435)),
    ("onnx-int8", "onnxruntime-cpu", 0.6353, (0.6215, 0.6481)),
    ("onnx-int8-dynamic", "onnxruntime-cpu", 0.6072, (0.5987, 0.6682)),
    ("onnx-optimized-fp32", "onnxruntime-cpu", 0.8693, (0.6584, 0.9170)),
]


def test_the_reason_never_calls_a_member_of_the_fastests_group_tied_with_the_winner() -> None:
    """The tie group is built around the fastest: onnx-optimized-fp32 [0.658–0.917] overlaps the fastest
    [0.599–0.668] but not the winner [0.600–0.651], and the sign-off listed it as 'tied with the winner'."""
    from tests.claims import tie_sentence_problems, winner_problems

    speed = {"results": [_row(a, p50, ci, runtime=rt) for a, rt, p50, ci in AUDIO]}
    accuracy = {"artifacts": {a: _entry(True, {rt: True}) for a, rt, _, _ in AUDIO}}
    winner = choose(_recipe(), speed, accuracy)
    assert winner["artifact"] == "onnx-fp32"
    assert "tied with the winner" not in winner["reason"]
    assert winner["reason"].endswith(
        "the simplest of the candidates within noise of the fastest is chosen (the others within noise of the "
        "fastest: onnx-fp16 (onnxruntime-cpu) 0.619 ms [0.589–0.643], onnx-int8 (onnxruntime-cpu) 0.635 ms "
        "[0.622–0.648], onnx-optimized-fp32 (onnxruntime-cpu) 0.869 ms [0.658–0.917])"
    ), winner["reason"]
    page = f"## Winner\n\nWhy: {winner['reason']}\n\n## Accuracy\n"
    assert winner_problems(page, winner, speed, accuracy) == []
    # the claim checker catches the sentence as the hold-out's sign-off printed it
    printed = winner["reason"].replace("the others within noise of the fastest", "tied with the winner")
    [problem] = tie_sentence_problems(printed, winner, _claimed_candidates(speed, winner, accuracy))
    assert problem.startswith(
        "the reason puts onnx-optimized-fp32 (onnxruntime-cpu) [0.6584, 0.917] within noise"
    )


def _claimed_candidates(speed: dict, winner: dict, accuracy: dict) -> list[dict]:
    from tests.claims import _candidates

    return _candidates(speed, winner, "p50_ms", accuracy)


def test_the_claim_checker_catches_a_reason_naming_a_row_that_is_not_its_artifacts_best() -> None:
    """Selection weighs each artifact's best row: a reason naming another runtime of one of them names a row
    the checker holds no interval for, which must be a problem, not a pass."""
    from tests.claims import tie_sentence_problems

    speed = {"results": [_row(a, p50, ci, runtime=rt) for a, rt, p50, ci in AUDIO]}
    accuracy = {"artifacts": {a: _entry(True, {rt: True}) for a, rt, _, _ in AUDIO}}
    winner = choose(_recipe(), speed, accuracy)
    other = winner["reason"].replace("onnx-fp16 (onnxruntime-cpu)", "onnx-fp16 (onnxruntime-cpu-bucketed)")
    [problem] = tie_sentence_problems(other, winner, _claimed_candidates(speed, winner, accuracy))
    assert problem == (
        "the reason names onnx-fp16 (onnxruntime-cpu-bucketed), not onnx-fp16's best row onnx-fp16 (onnxruntime-cpu)"
    )


def _served(artifact: str, qps: float, ci: tuple[float, float], held: int = 3) -> dict:
    return {
        "artifact": artifact,
        "runtime": "onnxruntime-cpu",
        "io": "host",
        "p99_target_ms": 20.0,
        "max_qps": qps,
        "ci95": list(ci),
        "served": {"held": held, "of": 3},
    }


def test_the_served_objective_sets_aside_a_row_a_simpler_row_serving_more_beats() -> None:
    """The served-rate objective follows rule 9 as the latency one does: `onnx-fp16` overlaps the best and is
    simpler than it, but `onnx-fp32`, simpler still, serves more within its noise: `onnx-fp16` cannot win the tie
    for its simplicity, and the best (nothing simpler and better remains) wins."""
    policy = _recipe(
        "selection.objective={metric: max_qps_at_p99, p99_ms: 20}",
        "benchmark.scenarios=[single_stream, server]",
    )
    names = ("onnx-optimized-fp16", "onnx-fp32", "onnx-fp16")
    accuracy = {"artifacts": {name: _entry(True) for name in names}}
    load = {
        "results": [
            _served("onnx-optimized-fp16", 900.0, (850.0, 1000.0)),
            _served("onnx-fp32", 800.0, (790.0, 810.0)),
            _served("onnx-fp16", 780.0, (700.0, 860.0)),
        ]
    }
    winner = choose_served(policy, load, {"results": []}, accuracy)
    assert winner is not None and winner["artifact"] == "onnx-optimized-fp16"
    assert winner["within_noise_of"] == []
    assert "beaten by the simpler onnx-fp32 (onnxruntime-cpu) at 800 requests/s" in winner["reason"]
    assert winner["reason"].startswith("serves the most within p99 ≤ 20 ms at 900 requests/s")
    # a simpler row whose rate did not hold in every run sets nothing aside: the simplest of the tie wins
    load["results"][1] = _served("onnx-fp32", 800.0, (790.0, 810.0), held=2)
    winner = choose_served(policy, load, {"results": []}, accuracy)
    assert winner is not None and winner["artifact"] == "onnx-fp16"
    assert "beaten" not in winner["reason"]
