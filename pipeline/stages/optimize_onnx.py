"""ONNX Runtime-optimized graphs in FP32 and FP16: fused contrib ops (Attention, SkipLayerNormalization, BiasGelu).

Each fused graph is checked before it is kept (pipeline/check/graph_check.py: the ONNX checker, an ONNX Runtime
load, and a run beside the FP32 graph on sample feeds). The fusions are written for the models their authors
tested; on another one a graph that fails its checks is replaced by the next safer option, and the record
says why: the recipe's fusions, then the transformers optimizer alone, then ONNX Runtime's own graph
optimizations alone (what a generic model gets by default).

Two fusion passes, in order (export.optimize.fusions): onnxscript's ONNX Runtime rewriter
(`onnxscript.rewriter.ort_fusions.optimize_for_ort`), which finds the attention pattern of a dynamo export,
then ONNX Runtime's transformers optimizer, which fuses what is left (on a dynamo export it finds no Attention;
the counts on MiniLM are in docs/benchmarking.md). Attention is what lets the CUDA provider use its
fused flash / memory-efficient kernels. These graphs hold com.microsoft ops, so they target ONNX Runtime only
(TensorRT and the quantizers take the plain graph). At opt_level 2 the transformers optimizer first runs ONNX
Runtime's own extended fusions for the CPU provider; level 1 leaves those to session load."""

from __future__ import annotations

import tempfile
import traceback
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import onnx

from pipeline.check.graph_check import Feeds, GraphRejected, check_graph
from pipeline.core.artifacts import ArtifactRecord
from pipeline.core.errors import StageError
from pipeline.core.variants import Variant, parse
from pipeline.decide.verdict import STAGE_WARNINGS
from pipeline.inputs.specs import DataSpec, ModelSpec
from pipeline.recipe import Fp16Export, OptimizeExport, Recipe
from pipeline.stages.base import Output, RunContext, Stage, StageConfig, StageResult
from pipeline.toolchain import float16_mend, onnx_tools, ort_probe
from pipeline.toolchain.capture import captured

CHECK_BATCH = 2  # the sample batch each fused graph is run on beside the FP32 graph


class OptimizeConfig(StageConfig):
    artifact: str  # onnx-optimized-<precision>
    optimize: OptimizeExport
    fp16: Fp16Export | None  # the FP16 conversion of the fused graph (the FP16 variant only)
    model: ModelSpec  # the transformers optimizer reads the model's heads and hidden size
    data: DataSpec  # the sample feeds each fused graph is checked on

    @classmethod
    def from_recipe(cls, recipe: Recipe, recipe_dir: Path, variant: Variant) -> OptimizeConfig:
        return cls(
            artifact=variant.name,
            optimize=recipe.export.optimize,
            fp16=recipe.export.fp16 if variant.precision == "fp16" else None,
            model=ModelSpec.from_recipe(recipe, recipe_dir),
            data=DataSpec.from_recipe(recipe, recipe_dir),
        )


@dataclass(frozen=True)
class Attempt:
    """One way to make the optimized graph: which fusion passes run, and whether the transformers optimizer
    may fuse transformer patterns (False: ONNX Runtime's own graph optimizations only)."""

    label: str
    fusions: tuple[str, ...]
    model_type: str | None
    opt_level: int | None = None  # None: the recipe's


def attempts(cfg: OptimizeExport) -> list[Attempt]:
    """The recipe's fusions first, then each safer option that differs from what came before, down to ONNX
    Runtime's basic optimizations (level 1: no provider-specific fused kernels, so the graph loads on every
    provider; a session applies the rest itself when it loads the graph)."""
    # the model_type named: where ONNX Runtime's fusions for it raise, the bare error says nothing of them
    configured = "as configured" + (f" (model_type {cfg.model_type})" if cfg.model_type else "")
    chain = [Attempt(configured, tuple(cfg.fusions), cfg.model_type)]
    if cfg.model_type is not None and "transformers" in cfg.fusions and "onnxscript" in cfg.fusions:
        chain.append(Attempt("the transformers optimizer alone", ("transformers",), cfg.model_type))
    if cfg.model_type is not None or "onnxscript" in cfg.fusions:
        chain.append(Attempt("ONNX Runtime's graph optimizations alone", ("transformers",), None))
    if cfg.opt_level > 1:
        chain.append(
            Attempt("ONNX Runtime's basic graph optimizations (level 1)", ("transformers",), None, 1)
        )
    return chain


def onnxscript_fusions(model: onnx.ModelProto) -> tuple[onnx.ModelProto, dict[str, int]]:
    """onnxscript's ONNX Runtime fusions; returns the fused graph and the count of each fusion applied."""
    import onnx_ir as ir
    from onnxscript.rewriter.ort_fusions import optimize_for_ort

    fused, counts = optimize_for_ort(ir.from_proto(model))
    return ir.to_proto(fused), {k: int(v) for k, v in sorted(counts.items()) if v}


def optimize_checked(
    source: Path,
    cfg: OptimizeExport,
    config: dict[str, Any],
    fp16: Fp16Export | None,
    feeds: Feeds,
    report: Any = lambda message: None,
) -> tuple[onnx.ModelProto, dict[str, Any]]:
    """The first attempt whose graph passes its checks, with the fusion statistics and, under `fallback`, why
    the attempts before it were rejected. Raises StageError when none passes."""
    rejected: list[dict[str, str]] = []
    for attempt in attempts(cfg):
        report(f"optimize: {attempt.label}")
        try:
            model, stats = optimize(source, cfg, config, fp16, attempt)
            _crash_probe(model, feeds)
            check_graph(model, source, feeds, every_provider=True)
        except Exception as exc:  # noqa: BLE001 - a failed attempt (GraphRejected included) falls back
            rejected.append({"attempt": attempt.label, "reason": f"{type(exc).__name__}: {first_line(exc)}"})
            continue
        stats["applied"] = attempt.label
        # what that attempt applied, which a fallback lowers from what the recipe asked for
        stats["opt_level"] = cfg.opt_level if attempt.opt_level is None else attempt.opt_level
        stats["model_type"] = attempt.model_type
        if rejected:
            stats["fallback"] = rejected
            stats[STAGE_WARNINGS] = [
                f"used {attempt.label}: "
                + "; ".join(f"{r['attempt']} was rejected ({r['reason']})" for r in rejected)
            ]
        return model, stats
    raise StageError(
        "optimize: no option gave a graph that passes its checks: "
        + "; ".join(f"{r['attempt']}: {r['reason']}" for r in rejected)
    )


def sample_feeds(ctx: RunContext, data: DataSpec) -> Feeds:
    """A small batch at the opt shape (CHECK_BATCH samples, within the batch dim's range) to check graphs on."""
    batch = data.dims.get(data.batch_dim)
    return ctx.dataset(data).corner_feeds("opt", batch=batch.clamp(CHECK_BATCH) if batch else None)


def _whole(value: Any) -> int:
    """A config's size as one whole number; 0 (unknown: the optimizer detects it) for a list of sizes per
    stage (Segformer's heads), a missing one or anything else."""
    return value if isinstance(value, int) and not isinstance(value, bool) else 0


def _crash_probe(model: onnx.ModelProto, feeds: Feeds) -> None:
    """Load and run the rewritten graph in a child first: ONNX Runtime crashed the deploy's process loading an
    FP16 graph with fused attention (a two-tower model), where a child's crash is one rejected attempt."""
    with tempfile.TemporaryDirectory(prefix="optimize-probe-") as tmp:
        path, folder = Path(tmp) / "graph.onnx", Path(tmp) / "feeds"
        onnx_tools.save(model, path)
        folder.mkdir()
        for name in onnx_tools.graph_inputs(model):  # only the graph's own: a stray name stops the run
            if name in feeds:
                np.save(folder / f"{name}.npy", feeds[name])
        try:
            ort_probe.load_problem(path, feeds=(folder,))  # an ordinary error: check_graph names it
        except ort_probe.Crashed as exc:
            raise GraphRejected(str(exc)) from None


def first_line(exc: BaseException) -> str:
    """The exception's message in one line; for one without a message (a bare assert in a tool), where it
    was raised."""
    text = " ".join(str(exc).split())
    if not text and exc.__traceback__ is not None:
        frame = traceback.extract_tb(exc.__traceback__)[-1]
        text = f"raised without a message at {Path(frame.filename).name}:{frame.lineno} ({frame.line or '?'})"
    return text if len(text) <= 300 else text[:299] + "…"


def optimize(
    source: Path,
    cfg: OptimizeExport,
    config: dict[str, Any],
    fp16: Fp16Export | None,
    attempt: Attempt | None = None,
) -> tuple[onnx.ModelProto, dict[str, Any]]:
    """Run the fusion passes (and the FP16 conversion, when `fp16` is given) on the graph of the model whose
    transformers config is `config`; returns the graph and the fusion statistics. Tools that write into the
    working directory (symbolic shape inference does, when it cannot finish) run in a scratch one."""
    attempt = attempt or attempts(cfg)[0]
    with onnx_tools.scratch_cwd():
        return _optimize(source.resolve(), cfg, config, fp16, attempt)


def _optimize(
    source: Path, cfg: OptimizeExport, config: dict[str, Any], fp16: Fp16Export | None, attempt: Attempt
) -> tuple[onnx.ModelProto, dict[str, Any]]:
    try:
        from onnxruntime.transformers.optimizer import optimize_model
    except ImportError as exc:
        raise StageError(
            f"optimize_onnx: needs onnxruntime ({exc}); pip install 'deploy-pipeline[cpu]'"
        ) from exc
    graph: str | onnx.ModelProto = str(source)
    report: dict[str, Any] = {}
    if "onnxscript" in attempt.fusions:
        try:
            graph, report["onnxscript"] = onnxscript_fusions(onnx_tools.load(source))
        except Exception as exc:  # noqa: BLE001 - a rewriter failure leaves the transformers optimizer's graph
            report["onnxscript_error"] = f"{type(exc).__name__}: {str(exc).splitlines()[0][:300]}"
    if "transformers" not in attempt.fusions:
        model = graph if isinstance(graph, onnx.ModelProto) else onnx_tools.load(source)
        return _finish(model, fp16), report
    if isinstance(graph, onnx.ModelProto):  # the optimizer reads a file (given a proto, it writes one)
        onnx_tools.save(graph, "fused.onnx")
        graph = str(Path("fused.onnx").resolve())
    heads, hidden = _whole(config.get("num_attention_heads")), _whole(config.get("hidden_size"))
    if not heads or hidden % heads:  # no attention (Mamba, RWKV) or sizes it cannot split: let it detect them
        heads = hidden = 0  # (the optimizer asserts on hidden_size without heads)
    optimized = optimize_model(
        graph,
        model_type=attempt.model_type or "bert",
        num_heads=heads,
        hidden_size=hidden,
        opt_level=cfg.opt_level if attempt.opt_level is None else attempt.opt_level,
        use_gpu=False,
        only_onnxruntime=attempt.model_type is None,  # no transformer fusions for other models
    )
    report["transformers"] = {
        k: int(v) for k, v in sorted(optimized.get_fused_operator_statistics().items()) if v
    }
    return _finish(optimized.model, fp16), report


def _finish(model: onnx.ModelProto, fp16: Fp16Export | None) -> onnx.ModelProto:
    if fp16 is not None:
        from onnxruntime.transformers.onnx_model import OnnxModel

        onnx_tools.outputs_from_nodes(model)
        wrapped = OnnxModel(model)
        wrapped.convert_float_to_float16(
            keep_io_types=fp16.keep_io_types,
            op_block_list=onnx_tools.fp16_block_list(fp16.block_ops),
            node_block_list=onnx_tools.fp16_node_block_list(model.graph),
        )
        model = wrapped.model
        float16_mend.mend(model.graph)
    onnx_tools.ensure_opset_imports(model)
    onnx_tools.topological_sort(model.graph)
    return model


def _run(ctx: RunContext, config: OptimizeConfig, inputs: dict[str, ArtifactRecord]) -> StageResult:
    variant = parse(config.artifact)
    name = f"optimize_onnx_{variant.precision}"
    ctx.report(f"{name}: running the ONNX Runtime transformer optimizer")
    log = f"logs/{name}.log"
    feeds = sample_feeds(ctx, config.data)
    with captured(ctx.path(log)):
        model, fusions = optimize_checked(
            inputs["onnx-fp32"].path,
            config.optimize,
            ctx.model(config.model).config,
            config.fp16,
            feeds,
            ctx.report,
        )
    onnx_tools.save(model, ctx.path(variant.file))
    warnings = fusions.pop(STAGE_WARNINGS, [])
    details: dict[str, Any] = {
        STAGE_WARNINGS: warnings,
        "target": "onnxruntime",
        "applied": fusions.pop("applied"),
        "fallback": fusions.pop("fallback", []),
        "fused_ops": fusions.get("transformers", {}),
        "fusions": fusions,
        "contrib_ops": {
            k: v for k, v in onnx_tools.op_counts(model).items() if k.startswith("com.microsoft.")
        },
        "opt_level": fusions.pop("opt_level"),
        "model_type": fusions.pop("model_type"),
    }
    if config.fp16 is not None:
        details["fp16_node_share"] = onnx_tools.fp16_node_share(model)
        details["reducing_scatters_in_fp32"] = [
            n.name for n in onnx_tools.reducing_scatter_nodes(model.graph)
        ]
        if details["fp16_node_share"] == 0:  # its FP32 graph (a model computing in float64), timed as FP16
            raise StageError(
                f"{name}: no node of the optimized graph computes in float16 (the converter changes float32 "
                "only; this graph computes in another type)"
            )
    return StageResult(
        outputs=[Output(variant.file, "onnx", variant.name, variant.precision, details), Output(log, "log")],
        details=details,
    )


def stages(recipe: Recipe, recipe_dir: Path, variants: list[Variant]) -> list[Stage]:
    """One stage per optimized variant asked for (FP32, FP16)."""
    return [
        Stage(
            name=f"optimize_onnx_{variant.precision}",
            version=8,  # CHANGELOG.md, "Stage versions"
            config=OptimizeConfig.from_recipe(recipe, recipe_dir, variant),
            run=_run,
            environment=onnx_tools.onnx_environment,
            consumes=("onnx-fp32",),
            produces=(variant.name,),
        )
        for variant in sorted(variants, key=lambda v: v.precision != "fp32")
        if variant.format == "onnx" and variant.flavour == "optimized"
    ]
