"""INT8 ONNX with explicit Quantize/DequantizeLinear pairs, calibrated on the calibration split.

The graph is built for TensorRT (strongly typed: INT8 exists only as Q/DQ in the graph), so the settings are
the ones a TensorRT build accepts: symmetric int8 activations and weights, per-channel weights, a Q/DQ pair on
every weight, dedicated pairs per consumer, no int32 bias DequantizeLinear (TensorRT rejects those), and Q/DQ
on the inputs of quantized ops only (TensorRT places GEMM outputs itself). What gets quantized is the recipe's
choice: op types, weight MatMuls only, and fnmatch include/exclude on module paths, because quantizing every
MatMul of an encoder costs too much accuracy (the figures are in docs/benchmarking.md). On ONNX Runtime's CPU
provider this graph is not meant to be fast; onnx-int8-dynamic is the CPU variant."""

from __future__ import annotations

import tempfile
from collections import Counter
from pathlib import Path
from typing import Any

import onnx

from pipeline.check.accuracy import nonfinite_count
from pipeline.check.graph_check import GraphRejected, check_graph
from pipeline.core.artifacts import ArtifactRecord
from pipeline.core.errors import StageError
from pipeline.core.variants import Variant, parse
from pipeline.decide.verdict import STAGE_WARNINGS
from pipeline.inputs.data import Dataset, Feeds
from pipeline.inputs.specs import DataSpec
from pipeline.recipe import Int8Export, Recipe
from pipeline.stages.base import Output, RunContext, Stage, StageConfig, StageResult
from pipeline.toolchain import onnx_tools
from pipeline.toolchain.capture import captured

FILE = parse("onnx-int8").file
LOG = "logs/int8.log"
CALIBRATION_BATCH = 8
HINT_BATCHES = 16  # calibration batches a failed calibration's NaN hint runs at most
METHODS = {"minmax": "MinMax", "entropy": "Entropy", "percentile": "Percentile"}
# Fixed, TensorRT-compatible quantizer settings (part of the stage config, so a change re-runs the stage).
SETTINGS: dict[str, Any] = {
    "format": "QDQ",
    "activation_type": "QInt8",
    "weight_type": "QInt8",
    "per_channel": True,
    "ActivationSymmetric": True,
    "WeightSymmetric": True,
    "QuantizeBias": False,
    "AddQDQPairToWeight": True,
    "DedicatedQDQPair": True,
    "exclude_output_quantization": True,
    "calibration_batch": CALIBRATION_BATCH,
}


class Int8Config(StageConfig):
    int8: Int8Export
    settings: dict[str, Any]  # SETTINGS: fixed, but a change to them must re-run the stage
    data: DataSpec  # calibration split

    @classmethod
    def from_recipe(cls, recipe: Recipe, recipe_dir: Path) -> Int8Config:
        return cls(int8=recipe.export.int8, settings=SETTINGS, data=DataSpec.from_recipe(recipe, recipe_dir))


class FeedsReader:
    """ONNX Runtime's calibration-reader protocol over in-memory feeds. `set_range` lets the quantizer hand
    the calibrator one batch at a time (CalibStridedMinMax=1): histogram calibrators stack each collected
    pass into one array, which fails when text batches differ in length."""

    def __init__(self, feeds: list[Feeds]):
        self.feeds = feeds
        self.set_range(0, len(feeds))

    def __len__(self) -> int:
        return len(self.feeds)

    def set_range(self, start_index: int, end_index: int) -> None:
        self._iter = iter(self.feeds[start_index:end_index])

    def get_next(self) -> Feeds | None:
        return next(self._iter, None)


def calibration_feeds(dataset: Dataset, graph_inputs: list[str]) -> list[Feeds]:
    """The calibration split only (never validation), restricted to the inputs the graph declares."""
    feeds = [
        {k: v for k, v in batch.items() if k in graph_inputs}
        for batch in dataset.split_feeds("calibration", CALIBRATION_BATCH)
    ]
    if not feeds:
        raise StageError("int8: the calibration split is empty (data.calibration and the sample count)")
    return feeds


def preprocess(source: Path, target: Path) -> str:
    """ONNX Runtime's pre-quantization shape inference (symbolic, then ONNX), without its optimization pass
    (that would fuse into com.microsoft ops, which TensorRT cannot parse). Returns what was done: on graphs
    symbolic inference cannot complete, the quantizer's own ONNX shape inference is all there is."""
    from onnxruntime.quantization.shape_inference import quant_pre_process

    try:
        with onnx_tools.scratch_cwd():
            quant_pre_process(str(source.resolve()), str(target.resolve()), skip_optimization=True)
    except Exception as exc:  # noqa: BLE001 - a failed pre-pass only means the plain graph is quantized
        return f"skipped: {type(exc).__name__}: {str(exc)[:200]}"
    return "symbolic shape inference"


def quantize(source: Path, target: Path, reader: FeedsReader, cfg: Int8Export, nodes: list[str]) -> None:
    from onnxruntime.quantization import CalibrationMethod, QuantFormat, QuantType, quantize_static

    extra = {
        key: SETTINGS[key]
        for key in (
            "ActivationSymmetric",
            "WeightSymmetric",
            "QuantizeBias",
            "AddQDQPairToWeight",
            "DedicatedQDQPair",
        )
    }
    extra.update(
        CalibStridedMinMax=1,
        CalibPercentile=cfg.percentile,
        OpTypesToExcludeOutputQuantization=list(cfg.op_types),
    )
    quantize_static(
        str(source),
        str(target),
        reader,
        quant_format=QuantFormat.QDQ,
        op_types_to_quantize=list(cfg.op_types),
        nodes_to_quantize=nodes,
        per_channel=SETTINGS["per_channel"],
        activation_type=QuantType.QInt8,
        weight_type=QuantType.QInt8,
        calibrate_method=getattr(CalibrationMethod, METHODS[cfg.calibration]),
        calibration_providers=["CPUExecutionProvider"],
        extra_options=extra,
    )


def nonfinite_calibration(graph: Path, feeds: list[Feeds]) -> str:
    """Why calibration failed when the FP32 graph itself computes NaN or inf on the calibration split (a range
    of NaN is ONNX Runtime's 'scale issue'): which output, on which batch; else nothing."""
    import onnxruntime as ort

    try:
        session = ort.InferenceSession(str(graph), providers=["CPUExecutionProvider"])
        names = [o.name for o in session.get_outputs()]
        for number, batch in enumerate(feeds[:HINT_BATCHES], 1):
            for name, value in zip(names, session.run(None, batch), strict=True):
                bad = nonfinite_count(value)
                if bad:
                    shapes = ", ".join(f"{k} {'×'.join(map(str, v.shape))}" for k, v in batch.items())
                    return (
                        f"; the FP32 graph itself computes {bad} NaN/inf values in output '{name}' on calibration "
                        f"batch {number} ({shapes}): calibration needs finite values (do the inputs' ranges "
                        "make sense, e.g. a mask that hides a whole row?)"
                    )
    except Exception:  # noqa: BLE001 - a hint only: the quantizer's own message stands
        return ""
    return ""


def nothing_left(model: onnx.ModelProto, cfg: Int8Export, selection: onnx_tools.Selection) -> str:
    """Why no node was selected, in the graph's own terms: which weight ops it has, and what left them out."""
    weights = onnx_tools.op_counts(onnx.ModelProto(graph=onnx.GraphProto(node=onnx_tools.weight_ops(model))))
    has = ", ".join(f"{n} {k}" for k, n in weights.items()) or "no MatMul or Gemm with a weight"
    reasons = Counter(selection.excluded.values())
    left_out = "; ".join(f"{n} {why}" for why, n in reasons.items())
    return f"export.int8.op_types is {list(cfg.op_types)}; the graph has {has}" + (
        f"; left out: {left_out}" if left_out else ""
    )


def quantized_nodes(model: onnx.ModelProto, op_types: list[str]) -> list[str]:
    """Names of the nodes of `op_types` that read a DequantizeLinear output: what really runs in INT8."""
    dq_outputs = {o for n in model.graph.node if n.op_type == "DequantizeLinear" for o in n.output}
    return [
        n.name for n in model.graph.node if n.op_type in op_types and any(i in dq_outputs for i in n.input)
    ]


def _run(ctx: RunContext, config: Int8Config, inputs: dict[str, ArtifactRecord]) -> StageResult:
    cfg, dataset = config.int8, ctx.dataset(config.data)
    target = ctx.path(FILE)
    with tempfile.TemporaryDirectory(prefix="int8-") as tmp, captured(ctx.path(LOG)):
        source = Path(tmp) / "preprocessed.onnx"
        ctx.report("int8: shape inference before quantization")
        pre = preprocess(inputs["onnx-fp32"].path, source)
        if not source.exists():
            source = inputs["onnx-fp32"].path
        model = onnx_tools.load(source)
        graph_inputs = onnx_tools.graph_inputs(model)
        selection = onnx_tools.select_nodes(
            model, cfg.op_types, cfg.weights_only_matmul, cfg.include, cfg.exclude, cfg.exclude_feed_forward
        )
        if not selection.quantize:
            raise StageError(f"int8: nothing to quantize: {nothing_left(model, cfg, selection)}")
        feeds = calibration_feeds(dataset, graph_inputs)
        ctx.report(
            f"int8: {cfg.calibration} calibration on {len(feeds)} batches, {len(selection.quantize)} nodes"
        )
        try:
            quantize(source, Path(tmp) / FILE, FeedsReader(feeds), cfg, selection.quantize)
        except Exception as exc:  # noqa: BLE001 - this variant's failure, with the quantizer's own message
            raise StageError(
                f"int8: {cfg.calibration} calibration/quantization failed: {type(exc).__name__}: {exc}"
                + nonfinite_calibration(source, feeds)
            ) from exc
        result = onnx_tools.load(Path(tmp) / FILE)
        try:
            check_graph(result)
        except GraphRejected as exc:
            raise StageError(f"int8: the quantized graph is unusable: {exc}") from exc
        if not quantized_nodes(result, cfg.op_types):  # its FP32 graph, which would be timed as INT8
            raise StageError(
                f"int8: the quantizer quantized none of the {len(selection.quantize)} nodes selected "
                f"({', '.join(sorted(set(cfg.op_types)))} with float32 weights are what it takes)"
            )
    onnx_tools.save(result, target)
    details = _details(dataset, result, selection, cfg, feeds, pre)
    return StageResult(
        outputs=[Output(FILE, "onnx", "onnx-int8", "int8", details), Output(LOG, "log")], details=details
    )


def _details(
    dataset: Dataset,
    model: onnx.ModelProto,
    selection: onnx_tools.Selection,
    cfg: Int8Export,
    feeds: list[Feeds],
    pre: str,
) -> dict[str, Any]:
    counts = onnx_tools.op_counts(model)
    done = quantized_nodes(model, cfg.op_types)
    warnings = []
    if pre.startswith("skipped"):
        warnings.append(
            "ONNX Runtime's symbolic shape inference could not finish on this graph "
            f"({pre.removeprefix('skipped: ')}); it was quantized with ONNX shape inference only"
        )
    return {
        STAGE_WARNINGS: warnings,
        "calibration_method": cfg.calibration,
        "calibration_samples": sum(len(next(iter(batch.values()))) for batch in feeds),
        "calibration_hash": dataset.calibration_hash(),
        "quantized_nodes": [selection.label(n) for n in done],
        "quantized_count": len(done),
        "qdq_pairs": counts.get("QuantizeLinear", 0),
        "quantize_linear": counts.get("QuantizeLinear", 0),
        "dequantize_linear": counts.get("DequantizeLinear", 0),
        "excluded": selection.by_pattern(),
        "kept_float_feed_forward": selection.feed_forward(),
        "activation_matmuls_skipped": selection.activation_matmuls(),
        "preprocess": pre,
        "settings": SETTINGS,
    }


def stages(recipe: Recipe, recipe_dir: Path, variants: list[Variant]) -> list[Stage]:
    if not any(v.name == "onnx-int8" for v in variants):
        return []
    return [
        Stage(
            name="int8",
            version=4,  # CHANGELOG.md, "Stage versions"
            config=Int8Config.from_recipe(recipe, recipe_dir),
            run=_run,
            environment=onnx_tools.onnx_environment,
            consumes=("onnx-fp32",),
            produces=("onnx-int8",),
        )
    ]
