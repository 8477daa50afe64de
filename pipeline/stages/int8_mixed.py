"""Dynamic INT8 whose quantized layers are chosen by measured accuracy and measured speed (`onnx-int8-mixed`).

`onnx-int8-dynamic` quantizes every weight MatMul and `onnx-int8` leaves out what a family default names;
neither asks the model. Tools that do ask optimize one side: Polygraphy's bisect, NNCF and Intel Neural
Compressor search for accuracy, ModelOpt for a proxy of speed (effective bits). Here both are measured:

1. *Sensitivity*: each weight MatMul/Gemm is quantized alone (ONNX Runtime's dynamic quantizer with
   onnx-int8-dynamic's settings) and run on the calibration split against the FP32 graph; its sensitivity is
   the share of the recipe's INT8 tolerance it uses, judged by the checks validation applies (1.0: at the gate).
2. *The mix*: layers are quantized least sensitive first. The largest count that still passes the INT8 gate
   on the calibration split is found by bisection, each mix built and run (accuracy falls as layers are added).
3. *Speed*: that mix, its neighbours (a step fewer and a step more layers), every layer and none are timed side
   by side, round by round, on ONNX Runtime's CPU provider at the objective's batch, on calibration samples at
   their own lengths. The fastest that passes is kept when it is faster beyond the noise (95% intervals of the
   p50 apart); among passing mixes within noise of it, the most accurate. Quantizing a layer is not free (its
   activations are quantized on every call), so the most quantized mix is not always the fastest.

The choice uses the calibration split only; the validate stage then judges the artifact on held-out data
against PyTorch like every other. The report (details, and the sign-off's "Mixed precision" section) gives
each layer's sensitivity, the chosen mix and the neighbours' speed."""

from __future__ import annotations

import math
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import onnx

from pipeline.bench.stats import latency_stats
from pipeline.bench.timer import CpuTimer
from pipeline.check.accuracy import (
    COMPARABLE,
    FINITE,
    ArtifactAccuracy,
    Check,
    evaluate,
    real_tokens,
    tolerance_share,
)
from pipeline.core.artifacts import ArtifactRecord
from pipeline.core.errors import StageError
from pipeline.core.variants import Variant, parse
from pipeline.inputs.data import Feeds
from pipeline.inputs.specs import DataSpec
from pipeline.recipe import Recipe, Tolerance
from pipeline.runners.loaders import SessionFromPath
from pipeline.runners.onnxruntime_runner import OnnxRuntimeRunner
from pipeline.runners.ort_session import session_options
from pipeline.stages.base import ALONE, Output, RunContext, Stage, StageConfig, StageResult
from pipeline.stages.int8_dynamic import SETTINGS, quantize, quantized_count
from pipeline.toolchain import onnx_tools
from pipeline.toolchain.capture import captured

NAME = "int8_mixed"
VARIANT = "onnx-int8-mixed"
FILE = parse(VARIANT).file
LOG = "logs/int8_mixed.log"
CALIBRATION_BATCH = 8
SENSITIVITY_BATCHES = 4  # of the calibration split, for each layer alone (36 layers of MiniLM: 36 graphs run)
ROUNDS = 24  # timed calls per mix, interleaved round by round
WARMUP = 3


class Int8MixedConfig(StageConfig):
    settings: dict[str, Any]  # the dynamic quantizer's, shared with onnx-int8-dynamic
    tolerance: Tolerance  # the recipe's INT8 gate
    outputs: list[str]
    padding_mask: str | None
    padding_value: int
    data: DataSpec
    threads: int
    batch: int  # the objective's batch: where speed is measured
    rounds: int = ROUNDS

    @classmethod
    def from_recipe(cls, recipe: Recipe, recipe_dir: Path) -> Int8MixedConfig:
        from pipeline.inputs.specs import RunnerSettings

        validation = recipe.validation
        return cls(
            settings=SETTINGS,
            tolerance=validation.tolerances["int8"],
            outputs=list(recipe.outputs),
            padding_mask=validation.padding_mask,
            padding_value=validation.padding_value,
            data=DataSpec.from_recipe(recipe, recipe_dir),
            threads=RunnerSettings.from_recipe(recipe).threads,
            batch=recipe.selection.objective.batch or 1,
        )


def weight_layers(model: onnx.ModelProto) -> list[str]:
    """The MatMul and Gemm nodes whose second input is a weight (an initializer): what the quantizer takes."""
    weights = {i.name for i in model.graph.initializer}
    return [
        n.name
        for n in model.graph.node
        if n.op_type in SETTINGS["op_types"] and len(n.input) > 1 and n.input[1] in weights
    ]


class Mixes:
    """Builds and runs graphs with a given set of layers quantized, against the FP32 graph's outputs on the
    calibration split."""

    def __init__(self, config: Int8MixedConfig, source: Path, feeds: list[Feeds], scratch: Path):
        self.config, self.source, self.feeds, self.scratch = config, source, feeds, scratch
        self.reference = self._outputs(source, feeds)
        self.built = 0

    def path(self, nodes: list[str], label: str) -> Path:
        target = self.scratch / f"{label}.onnx"
        if not target.exists():
            quantize(self.source, target, nodes)
            self.built += 1
        return target

    def worst(self, path: Path, batches: int | None = None) -> tuple[bool, float]:
        """Whether the graph passes the INT8 gate on the calibration split (its first `batches`), and the
        largest share of its tolerance any required check uses."""
        accuracy = ArtifactAccuracy(VARIANT, "int8", self.runner(path, path.stem).runtime)
        feeds = self.feeds[:batches]
        masks = [real_tokens(f, self.config.padding_mask, self.config.padding_value) for f in feeds]
        evaluate(
            accuracy,
            {"calibration": self.reference[:batches]},
            {"calibration": self._outputs(path, feeds)},
            self.config.outputs,
            self.config.tolerance,
            {"calibration": masks},
        )
        return judgement(accuracy)

    def runner(self, path: Path, label: str) -> OnnxRuntimeRunner:
        load = SessionFromPath(path, self.config.threads, session_options)
        return OnnxRuntimeRunner(label, load, self.config.outputs)

    def _outputs(self, path: Path, feeds: list[Feeds]) -> list[dict[str, Any]]:
        runner = self.runner(path, path.stem)
        runner.activate()
        try:
            return [runner.infer(f) for f in feeds]
        finally:
            runner.deactivate()


def judgement(accuracy: ArtifactAccuracy) -> tuple[bool, float]:
    """Whether a mix passes the gate, and the largest share of its tolerance a required check uses (its
    sensitivity, for one layer alone)."""
    return accuracy.passed, max(
        (tolerance_used(c) for c in accuracy.checks if not c.informational), default=0.0
    )


def tolerance_used(check: Check) -> float:
    """The share of its tolerance a check uses; a failed finiteness or comparability check is past any."""
    if check.metric in (FINITE, COMPARABLE) or check.reason is not None:
        return math.inf if check.blocking else 0.0
    share = tolerance_share(check.metric, check.value, check.threshold)
    return share if share is not None else (math.inf if check.blocking else 0.0)


def choose(count: int, passes: Callable[[int], bool], step: int) -> tuple[int, list[int]]:
    """The largest number of layers (least sensitive first) whose mix passes, by bisection (0 always
    passes: nothing quantized), and the mixes to time: it, a step either side, every layer and none."""
    if passes(count):
        best = count
    else:
        low, high = 0, count  # low passes, high does not
        while high - low > 1:
            middle = (low + high) // 2
            if passes(middle):
                low = middle
            else:
                high = middle
        best = low
    timed = sorted({0, max(best - step, 0), best, min(best + step, count), count})
    return best, timed


def time_side_by_side(
    runners: dict[int, OnnxRuntimeRunner], feeds: list[Feeds], rounds: int
) -> dict[int, dict[str, Any]]:
    """Each runner's latency statistics (p50 and its 95% interval), timed one call each per round on the
    round's sample, so that drift, noise and the samples' lengths fall on all alike."""
    timer = CpuTimer()
    samples: dict[int, list[float]] = {k: [] for k in runners}
    for runner in runners.values():
        runner.activate()
    try:
        for runner in runners.values():
            runner.prepare(feeds[0])
            for _ in range(WARMUP):
                timer.measure(runner)
        for i in range(rounds):
            for k, runner in runners.items():
                runner.prepare(feeds[i % len(feeds)])
                samples[k].append(timer.measure(runner).ms)
    finally:
        for runner in runners.values():
            runner.deactivate()
    return {k: latency_stats(v) for k, v in samples.items()}


def fastest_within_noise(stats: dict[int, dict[str, Any]], shares: dict[int, float]) -> tuple[int, str]:
    """The kept mix among passing ones: the fastest by p50 when its interval is apart from every other's,
    else the most accurate (least tolerance used) of those within noise of it; and why, in one line."""
    fastest = min(stats, key=lambda k: stats[k]["p50_ms"])
    if len(stats) == 1:  # nothing to be beyond the noise of
        return fastest, "the only passing mix timed"
    low, high = stats[fastest]["p50_ci95_ms"]
    near = [k for k in stats if stats[k]["p50_ci95_ms"][0] <= high and stats[k]["p50_ci95_ms"][1] >= low]
    if near == [fastest]:
        return fastest, "the fastest passing mix, beyond the noise"
    chosen = min(near, key=lambda k: (shares[k], k))
    if chosen == fastest:
        return chosen, "the fastest passing mix, and the most accurate of those within noise of it"
    return (
        chosen,
        f"the most accurate of the passing mixes within noise of the fastest (which quantizes {fastest} layers)",
    )


def _run(ctx: RunContext, config: Int8MixedConfig, inputs: dict[str, ArtifactRecord]) -> StageResult:
    source = inputs["onnx-fp32"].path
    dataset = ctx.dataset(config.data)
    feeds = dataset.split_feeds("calibration", CALIBRATION_BATCH)
    if not feeds:
        raise StageError(f"{NAME}: the calibration split is empty: data.calibration must be at least 1")
    layers = weight_layers(onnx_tools.load(source))
    if not layers:
        raise StageError(f"{NAME}: the graph has no weight MatMul or Gemm to quantize")
    with tempfile.TemporaryDirectory(prefix="int8-mixed-") as tmp, captured(ctx.path(LOG)):
        mixes = Mixes(config, source, feeds, Path(tmp))
        sensitivity: dict[str, float] = {}
        unquantized: list[str] = []
        for i, layer in enumerate(layers, 1):
            ctx.report(f"{NAME}: sensitivity of layer {i}/{len(layers)} ({layer})")
            alone = mixes.path([layer], f"one-{i}")
            if not quantized_count(
                onnx_tools.op_counts(onnx_tools.load(alone))
            ):  # asked for by name, left in float (a Gemm the quantizer rewrote)
                unquantized.append(layer)
                continue
            sensitivity[layer] = mixes.worst(alone, SENSITIVITY_BATCHES)[1]
        if unquantized and len(unquantized) == len(layers):
            raise StageError(
                f"{NAME}: nothing was quantized: ONNX Runtime's dynamic quantizer, asked for each of the "
                f"{len(layers)} weight layers by name ({', '.join(layers[:3])}{'…' if len(layers) > 3 else ''}), "
                "quantized none of them"
            )
        layers = [layer for layer in layers if layer not in unquantized]
        order = sorted(layers, key=lambda name: sensitivity[name])
        verdicts: dict[int, tuple[bool, float]] = {0: (True, 0.0)}

        def judged(count: int) -> tuple[bool, float]:
            if count not in verdicts:
                ctx.report(
                    f"{NAME}: accuracy with the {count} least sensitive of {len(layers)} layers quantized"
                )
                verdicts[count] = mixes.worst(mixes.path(order[:count], f"mix-{count}"))
            return verdicts[count]

        best, timed = choose(len(layers), lambda k: judged(k)[0], max(1, len(layers) // 8))
        if best == 0:
            least = order[0]
            raise StageError(
                f"{NAME}: no layer can be quantized within the INT8 gate: the least sensitive ({least}) alone "
                + (
                    f"uses {sensitivity[least]:.2f}x its tolerance on the calibration split"
                    if math.isfinite(sensitivity[least])
                    else "fails a required check outright on the calibration split"
                )
            )
        for count in timed:
            judged(count)
        ctx.report(f"{NAME}: timing {len(timed)} mixes side by side at batch {config.batch}")
        runners = {
            k: mixes.runner(source if k == 0 else mixes.path(order[:k], f"mix-{k}"), f"mix-{k}")
            for k in timed
        }
        stats = time_side_by_side(runners, dataset.calibration_feeds(batch=config.batch), config.rounds)
        passing = {k: verdicts[k][1] for k in timed if k > 0 and verdicts[k][0]}
        chosen, why = fastest_within_noise({k: stats[k] for k in passing}, passing)
        model = onnx_tools.load(mixes.path(order[:chosen], f"mix-{chosen}"))
    onnx_tools.save(model, ctx.path(FILE))
    details = _details(layers, order, sensitivity, verdicts, stats, chosen, config, mixes.built)
    details["why"] = why
    if unquantized:
        details["not_quantizable"] = unquantized
    details["timed_at"]["runtime"] = runners[0].runtime
    ctx.report(f"{NAME}: {chosen} of {len(layers)} layers quantized")
    return StageResult(
        outputs=[Output(FILE, "onnx", VARIANT, "int8", details), Output(LOG, "log")], details=details
    )


def _details(
    layers: list[str],
    order: list[str],
    sensitivity: dict[str, float],
    verdicts: dict[int, tuple[bool, float]],
    stats: dict[int, dict[str, Any]],
    chosen: int,
    config: Int8MixedConfig,
    built: int,
) -> dict[str, Any]:
    quantized = set(order[:chosen])
    return {
        "target": "onnxruntime",
        "quantized_count": chosen,
        "layers": [
            {"node": name, "sensitivity": finite(sensitivity[name]), "quantized": name in quantized}
            for name in layers
        ],
        "mixes": [
            {
                "quantized": k,
                "passes": verdicts[k][0],
                "tolerance_share": finite(verdicts[k][1]),
                "p50_ms": round(stats[k]["p50_ms"], 3),
                "p50_ci95_ms": [round(v, 3) for v in stats[k]["p50_ci95_ms"]],
                "vs_float": round(stats[0]["p50_ms"] / stats[k]["p50_ms"], 3),
                "chosen": k == chosen,
            }
            for k in sorted(stats)
        ],
        "timed_at": {
            "batch": config.batch,
            "inputs": "calibration samples at their own lengths, one per round",
            "rounds": config.rounds,
        },
        "judged_on": "the calibration split, against the FP32 graph (each layer alone: its first "
        f"{SENSITIVITY_BATCHES * CALIBRATION_BATCH} samples)",
        "graphs_built": built,
        "settings": SETTINGS,
    }


def finite(share: float) -> float | None:
    """A share for JSON: None past any tolerance (a non-finite output)."""
    return round(share, 4) if math.isfinite(share) else None


def stages(recipe: Recipe, recipe_dir: Path, variants: list[Variant]) -> list[Stage]:
    if not any(v.name == VARIANT for v in variants):
        return []
    return [
        Stage(
            name=NAME,
            version=4,  # CHANGELOG.md, "Stage versions"
            config=Int8MixedConfig.from_recipe(recipe, recipe_dir),
            run=_run,
            environment=onnx_tools.onnx_environment,
            consumes=("onnx-fp32",),
            produces=(VARIANT,),
            placement=ALONE,  # it times its mixes: nothing may run beside it
        )
    ]
