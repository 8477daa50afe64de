"""TorchScript by tracing at the opt shape, checked against eager at every corner (tracing silently bakes
data-dependent branches in, so a trace is only trusted where it was compared).

The check tells numerics from behaviour. Its tolerance is `check_atol` at unit scale, multiplied by the
output's scale (max(1, largest |eager value|), as validation scales absolute tolerances) and on a CUDA device by
CUDA_FACTOR (the frozen trace folds BatchNorm into convolutions and cuDNN may pick other algorithms for it;
TF32 is off for the check). It compares what validation compares: a per-token output on real tokens only
(validation.padding_mask), since eager may compute padded positions another way (nn.TransformerEncoder's
nested-tensor fast path writes 0 there, its trace does not). A trace that disagrees is only said to depend on the
input shape with evidence: it agrees at one checked shape and not at another, or the tracer warned that it baked
in a Python value.

A trace also bakes in the device of every tensor it creates (position ids, masks), so a CPU trace loaded onto a
GPU fails with "found at least two devices". Where this host has a CUDA GPU, the module is traced a second time
on it (`model.cuda.ts`, checked the same way); the artifact's details map each device to its trace."""

from __future__ import annotations

import contextlib
import copy
import io
import math
import warnings
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import torch

from pipeline.check.accuracy import per_token_mask, real_tokens
from pipeline.core import host
from pipeline.core.artifacts import ArtifactRecord
from pipeline.core.errors import StageError, first_line
from pipeline.core.files import write_bytes_atomic
from pipeline.core.packages import package_version
from pipeline.core.variants import Variant, parse
from pipeline.decide.verdict import SHAPE_DEPENDENT, WEIGHTS
from pipeline.inputs.data import Dataset
from pipeline.inputs.models import positional
from pipeline.inputs.specs import DataSpec, ModelSpec
from pipeline.recipe import Recipe, TorchScriptExport
from pipeline.stages.base import Output, RunContext, Stage, StageConfig, StageResult
from pipeline.toolchain.inlined_functions import forward_of_functions

FILE = parse("torchscript-fp32").file
CUDA_FILE = "model.cuda.ts"  # the same module traced on the GPU (its devices baked in)
CUDA_FACTOR = 10.0  # how much looser the trace check is on a CUDA device than on the CPU (see above)
CONTROL_FLOW = "TracerWarning"  # the tracer's warning that a Python value (a branch, a size) was baked in


class TorchScriptConfig(StageConfig):
    torchscript: TorchScriptExport
    max_corner_batch: int  # the check at the max corner runs at the validation's batch there (memory)
    padding_mask: str | None  # validation.padding_mask: per-token outputs are compared on real tokens only
    padding_value: int
    model: ModelSpec
    data: DataSpec

    @classmethod
    def from_recipe(cls, recipe: Recipe, recipe_dir: Path) -> TorchScriptConfig:
        return cls(
            torchscript=recipe.export.torchscript,
            max_corner_batch=recipe.validation.corner_batches.get("max", 1),
            padding_mask=recipe.validation.padding_mask,
            padding_value=recipe.validation.padding_value,
            model=ModelSpec.from_recipe(recipe, recipe_dir),
            data=DataSpec.from_recipe(recipe, recipe_dir),
        )


def _max_diff(a: tuple[torch.Tensor, ...], b: tuple[torch.Tensor, ...]) -> float:
    """The largest absolute difference over the outputs. An output of another shape differs without bound; an
    empty one (a data-dependent output with no rows at this shape, such as the boxes that pass a score) by
    nothing."""
    worst = 0.0
    for x, y in zip(a, b, strict=True):
        if x.shape != y.shape:
            return math.inf
        if x.numel():
            worst = max(worst, float((x.float() - y.float()).abs().max()))
    return worst


def on_real_tokens(outputs: tuple[torch.Tensor, ...], mask: np.ndarray | None) -> tuple[torch.Tensor, ...]:
    """The outputs as validation compares them: a per-token output (accuracy.per_token_mask) with its padded
    positions zeroed; the rest, and every output where the batch has no padding mask, as they are."""
    if mask is None:
        return outputs
    kept = []
    for output in outputs:
        keep = per_token_mask(output, mask)  # reads only ndim and shape
        if keep is not None:
            where = torch.from_numpy(keep).to(output.device)
            output = torch.where(where, output, torch.zeros((), dtype=output.dtype, device=output.device))
        kept.append(output)
    return tuple(kept)


def output_scale(outputs: tuple[torch.Tensor, ...]) -> float:
    """max(1, largest |value|) over the outputs: what the check's absolute tolerance is multiplied by."""
    peaks = [float(o.float().abs().nan_to_num(0.0, 0.0, 0.0).max()) for o in outputs if o.numel()]
    return max([1.0, *peaks])


def check_tolerance(atol: float, scale: float, device: str) -> float:
    return atol * scale * (CUDA_FACTOR if device == "cuda" else 1.0)


def disagreement(
    device: str,
    checks: dict[str, float],
    tolerances: dict[str, float],
    tracer_warnings: list[str],
    masked: str | None = None,
) -> StageError:
    """The trace check's failure, with the shape-dependence claim only where the evidence supports it; `masked`
    names the padding mask when per-token outputs were compared on real tokens only."""
    bad = {c: d for c, d in checks.items() if not d <= tolerances[c]}
    good = [c for c in checks if c not in bad]
    control_flow = [w for w in tracer_warnings if w.startswith(CONTROL_FLOW)]
    figures = ", ".join(
        f"max abs diff {d:.3g} at {c} (tolerance {tolerances[c]:.3g})" for c, d in bad.items()
    )
    if good:
        evidence = f"it agrees at {', '.join(good)}: the model's behaviour depends on the input shape"
    elif control_flow:
        evidence = (
            f"the tracer baked in Python values ({len(control_flow)} TracerWarning(s)): {control_flow[0]}"
        )
    else:
        evidence = "at every checked shape, with no tracer warning: a numerical difference, not control flow"
    where = (
        f" on real tokens (padded positions of {masked} left out, as validation leaves them out)"
        if masked
        else ""
    )
    return StageError(
        f"traced module ({device}) disagrees with eager{where}: {figures}; {evidence}",
        details={
            SHAPE_DEPENDENT: bool(good or control_flow),
            "check_max_abs": checks,
            "check_tolerance": tolerances,
            "tracer_warnings": tracer_warnings,
        },
    )


def _warnings(caught: list[warnings.WarningMessage]) -> list[str]:
    return sorted({f"{w.category.__name__}: {str(w.message).splitlines()[0]}" for w in caught})


def _shapes(args: tuple[torch.Tensor, ...]) -> str:
    return ", ".join("×".join(map(str, a.shape)) for a in args)


def _run_at(
    traced: torch.jit.ScriptModule,
    corner: str,
    args: tuple[torch.Tensor, ...],
    example: tuple[torch.Tensor, ...],
    tracer_warnings: list[str],
) -> tuple[torch.Tensor, ...]:
    """The trace's outputs at a corner, or the located error of a trace that cannot run there (`unrunnable`)."""
    try:
        return traced(*args)
    except RuntimeError as exc:
        raise unrunnable(corner, args, example, exc, tracer_warnings) from None


def unrunnable(
    corner: str,
    args: tuple[torch.Tensor, ...],
    example: tuple[torch.Tensor, ...],
    error: RuntimeError,
    tracer_warnings: list[str],
) -> StageError:
    """A trace that raises at another shape than it was taken at: located, with why a trace does that (the
    interpreter's own message names an index and a size, not the shapes, the corner or the cause)."""
    control_flow = [w for w in tracer_warnings if w.startswith(CONTROL_FLOW)]
    cause = f" ({len(control_flow)} TracerWarning(s): {control_flow[0]})" if control_flow else ""
    return StageError(
        f"the trace taken at the opt shape ({_shapes(example)}) fails at the {corner} shape ({_shapes(args)}): "
        f"{first_line(error)}; a trace keeps the sizes and branches the model's code computed at the shape it "
        f"was taken at{cause}: fix the dims its code computes from in the recipe, or use the ONNX exports",
        details={SHAPE_DEPENDENT: True, "tracer_warnings": tracer_warnings},
    )


def _save(traced: torch.jit.ScriptModule, target: Path) -> None:
    """Serialized in memory and written by Python (temp file in the same folder, then a rename): torch's own
    file writer aborts the process on a full disk, a Python write raises an error the deploy reports."""
    buffer = io.BytesIO()
    torch.jit.save(traced, buffer)
    write_bytes_atomic(target, buffer.getvalue())


def _run(ctx: RunContext, config: TorchScriptConfig, inputs: dict[str, ArtifactRecord]) -> StageResult:
    model, dataset = ctx.model(config.model), ctx.dataset(config.data)
    traced, details = _trace(ctx, config, dataset, model.module, "cpu")
    details[WEIGHTS] = model.weights_digest()
    _save(traced, ctx.path(FILE))
    outputs = [Output(FILE, "torchscript", "torchscript-fp32", "fp32", details)]
    if host.has_cuda():
        module = copy.deepcopy(model.module).to("cuda")
        traced_cuda, cuda_details = _trace(ctx, config, dataset, module, "cuda")
        _save(traced_cuda, ctx.path(CUDA_FILE))
        details["devices"] = {"cpu": FILE, "cuda": CUDA_FILE}
        details["cuda_check_max_abs"] = cuda_details["check_max_abs"]
        details["cuda_check_tolerance"] = cuda_details["check_tolerance"]
        outputs.append(Output(CUDA_FILE, "torchscript"))
    return StageResult(outputs=outputs, details=details)


def _trace(
    ctx: RunContext, config: TorchScriptConfig, dataset: Dataset, module: torch.nn.Module, device: str
) -> tuple[torch.jit.ScriptModule, dict]:
    cfg = config.torchscript

    def on_device(args: tuple[torch.Tensor, ...]) -> tuple[torch.Tensor, ...]:
        return tuple(a.to(device) for a in args)

    def corner_args(corner: str, batch: int | None = None) -> tuple[torch.Tensor, ...]:
        return on_device(positional(dataset.corner_feeds(corner, batch), config.model))

    example = corner_args("opt", batch=_trace_batch(config.data))
    ctx.report(f"torchscript: tracing at the opt shape ({device})")
    with (
        warnings.catch_warnings(record=True) as caught,
        torch.inference_mode(False),
        torch.no_grad(),
        forward_of_functions(),  # TorchScript cannot save a Python autograd Function: trace its forward
    ):
        warnings.simplefilter("always")
        traced = torch.jit.trace(module, example, check_trace=False, strict=False)
        if cfg.freeze:
            # a trace that cannot run at a corner raises there as traced; frozen, the same call can crash the
            # process (a native segmentation fault in torch, seen with an RWKV model at a shorter length)
            for corner in cfg.check_corners:
                args = corner_args(corner, batch=config.max_corner_batch if corner == "max" else None)
                _run_at(traced, corner, args, example, _warnings(caught))
            traced = torch.jit.freeze(traced.eval())
    tracer_warnings = _warnings(caught)
    checks, tolerances, masked = {}, {}, False
    with torch.no_grad(), exact_float32(device):
        for corner in cfg.check_corners:
            ctx.report(f"torchscript: checking against eager at {corner} ({device})")
            batch = config.max_corner_batch if corner == "max" else None
            feeds = dataset.corner_feeds(corner, batch)  # once: the arguments and their padding mask
            args = on_device(positional(feeds, config.model))
            mask = real_tokens(feeds, config.padding_mask, config.padding_value)
            outputs = module(*args)
            # said only where an output is per-token: a pooled one is compared whole
            masked |= mask is not None and any(per_token_mask(o, mask) is not None for o in outputs)
            eager = on_real_tokens(outputs, mask)
            got = _run_at(traced, corner, args, example, tracer_warnings)  # unfrozen traces first run here
            checks[corner] = _max_diff(on_real_tokens(got, mask), eager)
            tolerances[corner] = check_tolerance(cfg.check_atol, output_scale(eager), device)
    if any(not d <= tolerances[c] for c, d in checks.items()):
        raise disagreement(
            device, checks, tolerances, tracer_warnings, config.padding_mask if masked else None
        )
    return traced, {
        "check_max_abs": checks,
        "check_tolerance": tolerances,
        "tracer_warnings": tracer_warnings,
        "frozen": cfg.freeze,
        "check_on": "real tokens" if masked else "every position",
    }


@contextlib.contextmanager
def exact_float32(device: str) -> Iterator[None]:
    """TF32 off on a CUDA device while the trace is checked: float32 eager and trace, compared as such."""
    if device != "cuda":
        yield
        return
    saved = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
    try:
        yield
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = saved


def stages(recipe: Recipe, recipe_dir: Path, variants: list[Variant]) -> list[Stage]:
    if not any(v.format == "torchscript" for v in variants):
        return []
    return [
        Stage(
            name="export_torchscript",
            version=6,  # CHANGELOG.md, "Stage versions"
            config=TorchScriptConfig.from_recipe(recipe, recipe_dir),
            run=_run,
            environment=lambda: {
                "torch": torch.__version__,
                "transformers": package_version("transformers"),
                "cuda": host.gpu_name(),
            },
            produces=("torchscript-fp32",),
        )
    ]


def _trace_batch(data: DataSpec) -> int:
    """2 (a batch of one would let the tracer bake the batch in as 1), brought within the batch dim's range: a
    model whose batch the recipe fixes at 4 may need that size to run at all."""
    rng = data.dims.get(data.batch_dim)
    return rng.clamp(2) if rng else 2
