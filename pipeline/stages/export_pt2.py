"""Compiled PyTorch artifacts: a torch.export ExportedProgram per precision (`exported-<p>`,
`model.exported[.<p>].pt2`) and an AOTInductor package compiled from it for this host's device (`aoti-<p>`,
`model.aoti.<p>.pt2`).

The ExportedProgram is traced once on the CPU with one symbolic dim per recipe dim; it is device-agnostic in
practice, since runners and the AOTInductor stage move it with `torch.export.passes.move_to_device_pass`,
which also rewrites device arguments baked into the graph (the failure mode of a TorchScript trace). Lower
precisions keep float32 inputs and outputs, as the FP16 ONNX graphs do. Transformers models are exported with
`scaled_dot_product_attention` (export.pt2.attention), which Inductor lowers to fused attention kernels; the
reference and the ONNX exports keep the eager attention. The AOTInductor compile time is recorded."""

from __future__ import annotations

import copy
import inspect
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, NamedTuple, Protocol

import torch
from torch import nn

from pipeline.core import host
from pipeline.core.artifacts import ArtifactRecord
from pipeline.core.children import run_job
from pipeline.core.errors import StageError
from pipeline.core.packages import package_version
from pipeline.core.variants import Variant, parse
from pipeline.decide.verdict import WEIGHTS
from pipeline.inputs.export_dims import dynamic_shapes, example_batch
from pipeline.inputs.models import positional
from pipeline.inputs.specs import DataSpec, ModelSpec
from pipeline.recipe import Recipe, Tolerance
from pipeline.stages.base import BACKGROUND, Output, RunContext, Stage, StageConfig, StageResult
from pipeline.stages.static_mix import StaticMix, chosen_layers
from pipeline.toolchain.aoti import device_info
from pipeline.toolchain.capture import captured
from pipeline.toolchain.fp8_linear import to_fp8
from pipeline.toolchain.int8_linear import to_int8
from pipeline.toolchain.static_linear import input_amax

DTYPES = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}
# FP8 and INT8 are FP16 with their linear layers in 8 bits, scales calibrated (pipeline/toolchain/
# static_linear.py): the dtype the rest computes in
COMPUTE = {**DTYPES, "fp8": torch.float16, "int8": torch.float16}
# the precisions that compute in FP16: where the GELU epilogue was measured (BF16 was not)
FP16_COMPUTE = frozenset(name for name, dtype in COMPUTE.items() if dtype == torch.float16)


class StaticPrecision(NamedTuple):
    """An 8-bit precision of the compiled path: how its layers are swapped in, its name in messages, and how its
    scales are set (the artifact's details say so)."""

    swap: Callable[[nn.Module, dict[str, float], torch.dtype], list[str]]
    label: str
    scales: str


STATIC = {
    "fp8": StaticPrecision(to_fp8, "FP8", "static: per tensor, inputs calibrated on the calibration split"),
    "int8": StaticPrecision(
        to_int8,
        "INT8",
        "static: weights per output channel, inputs per tensor calibrated on the calibration split",
    ),
}
CALIBRATION_BATCH = 8


class ExportConfig(StageConfig):
    precision: str
    attention: str  # export.pt2.attention
    fuse_projections: bool
    gelu_epilogue: bool  # asked for and FP16 compute: applied where `device` is a CUDA GPU
    conv_epilogue: bool  # the same, for convolutions (pipeline/toolchain/conv_epilogue.py)
    device: str  # export.pt2.device: auto | cpu | cuda
    memory_format: str  # export.pt2.memory_format
    model: ModelSpec
    data: DataSpec  # the example inputs, and the calibration split of the 8-bit precisions
    # the 8-bit precisions: the gate their layers are chosen by (pipeline/stages/static_mix.py), else None
    tolerance: Tolerance | None = None
    padding: tuple[str | None, int] = (None, 0)  # validation.padding_mask and padding_value

    @classmethod
    def from_recipe(cls, recipe: Recipe, recipe_dir: Path, precision: str) -> ExportConfig:
        validation = recipe.validation
        static = precision in STATIC
        return cls(
            precision=precision,
            attention=recipe.export.pt2.attention,
            fuse_projections=recipe.export.pt2.fuse_projections,
            gelu_epilogue=gelu_epilogue_for(recipe, precision),
            conv_epilogue=conv_epilogue_for(recipe, precision),
            device=recipe.export.pt2.device,
            memory_format=recipe.export.pt2.memory_format,
            model=ModelSpec.from_recipe(recipe, recipe_dir),
            data=DataSpec.from_recipe(recipe, recipe_dir),
            tolerance=validation.tolerances.get(precision) if static else None,
            padding=(validation.padding_mask, validation.padding_value) if static else (None, 0),
        )


class AotiConfig(StageConfig):
    precision: str
    device: str  # export.pt2.device: auto | cpu | cuda
    max_autotune: bool
    # fingerprinted like export.tensorrt.build_timeout_s: a timed-out compile is a failure
    compile_timeout_s: int

    @classmethod
    def from_recipe(cls, recipe: Recipe, precision: str) -> AotiConfig:
        pt2 = recipe.export.pt2
        return cls(
            precision=precision,
            device=pt2.device,
            max_autotune=pt2.max_autotune,
            compile_timeout_s=pt2.compile_timeout_s,
        )


def exported_file(precision: str) -> str:
    return parse(f"exported-{precision}").file or ""


def aoti_file(precision: str) -> str:
    return parse(f"aoti-{precision}").file or ""


class KeepIoTypes(nn.Module):
    """The model in a lower precision behind float32 inputs and outputs: floating inputs are cast in,
    floating outputs cast back to float32 (integer inputs such as token ids pass untouched). With
    channels_last, 4-D floating inputs are laid out NHWC inside the graph, so callers keep passing NCHW."""

    def __init__(self, inner: nn.Module, dtype: torch.dtype, channels_last: bool = False):
        super().__init__()
        self.inner, self.dtype, self.channels_last = inner, dtype, channels_last

    def forward(self, *args: torch.Tensor) -> tuple[torch.Tensor, ...]:
        cast = [a.to(self.dtype) if a.is_floating_point() else a for a in args]
        if self.channels_last:
            cast = [
                a.contiguous(memory_format=torch.channels_last)
                if a.dim() == 4 and a.is_floating_point()
                else a
                for a in cast
            ]
        out = self.inner(*cast)
        out = (out,) if isinstance(out, torch.Tensor) else tuple(out)
        return tuple(o.float() if o.is_floating_point() else o for o in out)


def channels_last(choice: str, module: nn.Module, example: tuple[Any, ...]) -> bool:
    """NHWC for the compiled model: as the recipe says, or (auto) where it has 2-D convolutions fed by a 4-D
    floating input, the case cuDNN's and oneDNN's NHWC kernels are made for."""
    if choice != "auto":
        return choice == "channels_last"
    convs = any(isinstance(m, nn.Conv2d) for m in module.modules())
    images = any(isinstance(t, torch.Tensor) and t.dim() == 4 and t.is_floating_point() for t in example)
    return convs and images


def use_sdpa(module: nn.Module) -> bool:
    """Switch every transformers model inside `module` to scaled_dot_product_attention; False if none."""
    switched = False
    for sub in module.modules():
        setter = getattr(sub, "set_attn_implementation", None)
        if callable(setter) and getattr(getattr(sub, "config", None), "_attn_implementation", None):
            setter("sdpa")
            switched = True
    return switched


def gelu_epilogue_for(recipe: Recipe, precision: str) -> bool:
    """Whether the program of this precision gets GELU epilogues (pipeline/toolchain/gelu_epilogue.py) where it
    is compiled for a CUDA GPU (`cuda_epilogue_on`): asked for, and FP16 compute."""
    return recipe.export.pt2.gelu_epilogue and precision in FP16_COMPUTE


def conv_epilogue_for(recipe: Recipe, precision: str) -> bool:
    """Whether the program of this precision gets cuDNN's fused convolutions (pipeline/toolchain/
    conv_epilogue.py) where it is compiled for a CUDA GPU (`cuda_epilogue_on`): asked for, and FP16 compute,
    the precision they were measured at."""
    return recipe.export.pt2.conv_epilogue and precision in FP16_COMPUTE


def cuda_epilogue_on(asked: bool, device: str) -> bool:
    """Asked for (`gelu_epilogue_for`, `conv_epilogue_for`) and compiled for a CUDA GPU, where the calls are
    cuBLASLt's and cuDNN's fused kernels: on a CPU a GELU epilogue is a GEMM and an exact GELU, two calls where
    Inductor would fuse the pair itself, and cuDNN's calls do not exist."""
    return asked and target_device(device) == "cuda"


def target_device(choice: str) -> str:
    """Where the AOTInductor package is compiled for: the recipe's choice, auto = cuda where present."""
    if choice == "auto":
        return "cuda" if host.has_cuda() else "cpu"
    return choice


def export_program(
    ctx: RunContext, config: ExportConfig
) -> tuple[torch.export.ExportedProgram, dict[str, Any]]:
    """torch.export of the recipe's model at the config's precision with every recipe dim symbolic."""
    spec, precision = config.model, config.precision
    module = copy.deepcopy(ctx.model(spec).module).eval()  # the shared module stays as the reference needs it
    sdpa = config.attention == "sdpa" and use_sdpa(module)
    dynamic = dynamic_shapes(spec)
    batch_dim = config.data.batch_dim
    feeds = ctx.dataset(config.data).corner_feeds("opt", batch=example_batch(spec, batch_dim))
    example = positional(feeds, spec)
    nhwc = channels_last(config.memory_format, module, example)
    dtype = COMPUTE[precision]
    static, mix = calibrated_layers(ctx, config, module) if precision in STATIC else ({}, {})
    module = module.to(dtype)
    if static:
        STATIC[precision].swap(module, static, dtype)
    if nhwc:
        module = module.to(memory_format=torch.channels_last)
    wrapped = KeepIoTypes(module, dtype, channels_last=nhwc).eval()
    with torch.no_grad():
        program = torch.export.export(wrapped, example, dynamic_shapes=(dynamic,), strict=False)
    details: dict[str, Any] = {
        WEIGHTS: ctx.model(spec).weights_digest(),
        "precision": precision,
        "attention": "sdpa" if sdpa else "model's own",
        "memory_format": "channels_last" if nhwc else "contiguous",
        "io_dtype": "float32 (floating inputs and outputs)",
        "dims": {name: [rng.min, rng.max] for name, rng in spec.dims.items()},
    }
    if static:
        details |= {
            f"{precision}_layers": sorted(static),
            f"{precision}_scales": STATIC[precision].scales,
            f"{precision}_mix": mix,
            "calibration_hash": ctx.dataset(config.data).calibration_hash(),
        }
    program, fused = fuse_as_asked(program, example, dynamic, config)
    details |= fused
    return program, details


def calibrated_layers(
    ctx: RunContext, config: ExportConfig, module: nn.Module
) -> tuple[dict[str, float], dict[str, Any]]:
    """The 8-bit layers and their calibrated input ranges, from the FP32 model on the calibration split: every
    calibrated layer, or the mix that passes the gate (pipeline/stages/static_mix.py), with what the details say
    of the choice. Refused where no layer qualifies, since the copy would be the FP16 one under another name."""
    dataset, spec, static = ctx.dataset(config.data), config.model, STATIC[config.precision]
    feeds = dataset.split_feeds("calibration", CALIBRATION_BATCH)
    batches = [positional(f, spec) for f in feeds]
    variant = f"exported-{config.precision}"
    if not batches:
        raise StageError(f"{variant}: the calibration split is empty (data.calibration and the sample count)")
    amax = input_amax(module, batches)
    if not amax:
        raise StageError(
            f"{variant}: no linear layer {static.label}'s GEMM takes (nn.Linear or transformers' Conv1D, both "
            f"widths multiples of 16) was reached on the calibration split: an {static.label} copy would be the "
            "FP16 one"
        )
    assert config.tolerance is not None
    mix = StaticMix(
        module,
        lambda m: KeepIoTypes(m, torch.float32),
        batches,
        feeds,
        spec.outputs,
        config.tolerance,
        config.padding,
    )
    try:
        layers, details = chosen_layers(mix, amax, static.swap, static.label, ctx.report)
    except StageError as error:
        raise StageError(f"{variant}: {error}") from None
    return {name: amax[name] for name in layers}, details


class FuseChoices(Protocol):
    """What the recipe asks of fusing, as both export stages' (frozen) configs hold it."""

    @property
    def fuse_projections(self) -> bool: ...

    @property
    def gelu_epilogue(self) -> bool: ...

    @property
    def conv_epilogue(self) -> bool: ...

    @property
    def device(self) -> str: ...


def fuse_as_asked(
    program: torch.export.ExportedProgram,
    example: tuple[torch.Tensor, ...],
    dynamic: tuple,
    asked: FuseChoices,
) -> tuple[torch.export.ExportedProgram, dict[str, Any]]:
    """fuse_program as the recipe asks, epilogues only where they pay (cuda_epilogue_on: CUDA's fused calls)."""
    gelu = cuda_epilogue_on(asked.gelu_epilogue, asked.device)
    conv = cuda_epilogue_on(asked.conv_epilogue, asked.device)
    return fuse_program(program, example, dynamic, asked.fuse_projections, gelu, conv)


def fuse_program(
    program: torch.export.ExportedProgram,
    example: tuple[torch.Tensor, ...],
    dynamic: tuple,
    projections: bool,
    gelu: bool,
    conv: bool = False,
) -> tuple[torch.export.ExportedProgram, dict[str, Any]]:
    """The program with projections on one input fused, linear + GELU pairs as one GEMM (the other GELUs in
    the same tanh form) and convolutions with their batch norm, residual add and ReLU as one cuDNN call (each
    where asked), and what the details say of it (`fused_projections`, `gelu_epilogues`, `tanh_gelus`,
    `conv_epilogues`, with `fuse_error` where fusing failed and the unfused program, as correct, is kept)."""
    choices = (
        ("fused_projections", projections),
        ("gelu_epilogues", gelu),
        ("tanh_gelus", gelu),  # after the epilogues: the GELUs they could not take
        ("conv_epilogues", conv),
    )
    asked = [key for key, on in choices if on]
    if not asked:
        return program, {}
    try:
        return _fused(program, example, dynamic, asked)
    except Exception as exc:  # noqa: BLE001 - the unfused program is as correct: keep it, say why
        error = f"{type(exc).__name__}: {(str(exc).splitlines() or [''])[0][:300]}"
        return program, dict.fromkeys(asked, 0) | {"fuse_error": error}


def _fused(
    program: torch.export.ExportedProgram, example: tuple[torch.Tensor, ...], dynamic: tuple, asked: list[str]
) -> tuple[torch.export.ExportedProgram, dict[str, int]]:
    """The program rewritten by the passes asked for, in order (pipeline/toolchain/fuse_projections.py and
    gelu_epilogue.py, conv_epilogue.py), and re-exported, with how much each rewrote."""
    from pipeline.toolchain.conv_epilogue import fuse_conv_epilogues
    from pipeline.toolchain.fuse_projections import fuse_linear_groups
    from pipeline.toolchain.gelu_epilogue import fuse_gelu_epilogues, tanh_gelus

    passes = {
        "fused_projections": fuse_linear_groups,
        "gelu_epilogues": fuse_gelu_epilogues,
        "tanh_gelus": tanh_gelus,
        "conv_epilogues": fuse_conv_epilogues,
    }
    module = program.module()
    counts = {key: passes[key](module) for key in asked}
    if not any(counts.values()):
        return program, counts
    params = inspect.signature(module.forward).parameters.values()
    starred = any(p.kind is inspect.Parameter.VAR_POSITIONAL for p in params)
    with torch.no_grad():  # the graph module takes the inputs one by one (or as *args, as the wrapper did)
        shapes = (dynamic,) if starred else dynamic
        return torch.export.export(module, example, dynamic_shapes=shapes, strict=False), counts


def _export(ctx: RunContext, config: ExportConfig, inputs: dict[str, ArtifactRecord]) -> StageResult:
    precision = config.precision
    ctx.report(f"export_pt2 {precision}: torch.export")
    file, log = exported_file(precision), f"logs/export_pt2_{precision}.log"
    started = time.perf_counter()
    with captured(ctx.path(log)):
        program, details = export_program(ctx, config)
        torch.export.save(program, str(ctx.path(file)))
    details["export_s"] = round(time.perf_counter() - started, 2)
    artifact = f"exported-{precision}"
    return StageResult(
        outputs=[Output(file, "exported", artifact, precision, details), Output(log, "log")],
        details=details,
    )


def _aoti(ctx: RunContext, config: AotiConfig, inputs: dict[str, ArtifactRecord]) -> StageResult:
    precision = config.precision
    return compile_package(
        ctx, config, inputs, source=parse(f"exported-{precision}"), target=parse(f"aoti-{precision}")
    )


def compile_package(
    ctx: RunContext,
    config: AotiConfig,
    inputs: dict[str, ArtifactRecord],
    *,
    source: Variant,
    target: Variant,
) -> StageResult:
    """Compile in a child process (pipeline.toolchain.aoti_child): the stage runs in the background of the
    deploy. The package keeps its program's packing, which its runners need to feed it."""
    precision = config.precision
    device = target_device(config.device)
    if device == "cuda" and not host.has_cuda():
        raise RuntimeError("export.pt2.device is cuda, but this host has no CUDA GPU")
    ctx.report(f"{target.name}: compiling with AOTInductor for {device}")
    file, log = target.file or "", f"logs/{target.name.replace('-', '_')}.log"
    with tempfile.TemporaryDirectory(prefix="aoti-") as tmp:
        job = {
            "source": str(inputs[source.name].path),
            "target": str(ctx.path(file)),
            "device": device,
            "max_autotune": config.max_autotune,
            "result": str(Path(tmp) / "result.json"),
        }
        outcome = run_job(
            "pipeline.toolchain.aoti_child",
            job,
            Path(tmp),
            config.compile_timeout_s,
            _own_lines(ctx.report),
            cancel=ctx.cancel,
        )
    ctx.path(log).write_text("\n".join(outcome.lines) + "\n")
    if outcome.result is None:
        raise RuntimeError(
            outcome.death(config.compile_timeout_s, "AOTInductor compile", "export.pt2.compile_timeout_s")
        )
    if not outcome.result["ok"]:
        raise RuntimeError(outcome.result["error"])
    details = {
        **outcome.result["device"],
        "precision": precision,
        "compile_s": outcome.result["compile_s"],
        "max_autotune": config.max_autotune,
    }
    packing = inputs[source.name].details.get("packing")
    if packing:
        details |= {"packing": packing, "attention": inputs[source.name].details.get("attention")}
    return StageResult(
        outputs=[Output(file, target.format, target.name, precision, details), Output(log, "log")],
        details=details,
    )


def _own_lines(report: Callable[[str], None]) -> Callable[[str], None]:
    """The child's own progress lines for the live display; the compiler's output goes to the log only."""
    return lambda line: report(line) if line.startswith("[aoti]") else None


def aoti_environment(choice: str) -> Callable[[], dict[str, Any]]:
    def environment() -> dict[str, Any]:
        device = target_device(choice)
        info = device_info(device) if device == "cpu" or host.has_cuda() else {"device": device}
        return {"torch": torch.__version__, "triton": package_version("triton"), **info}

    return environment


def stages(recipe: Recipe, recipe_dir: Path, variants: list[Variant]) -> list[Stage]:
    """An export stage per exported-<p> variant asked for, an AOTInductor stage per aoti-<p>."""
    out = []
    for precision in COMPUTE:
        if any(v.name == f"exported-{precision}" for v in variants):
            out.append(
                Stage(
                    name=f"export_pt2_{precision}",
                    version=7,  # CHANGELOG.md, "Stage versions"
                    config=ExportConfig.from_recipe(recipe, recipe_dir, precision),
                    run=_export,
                    environment=lambda: {
                        "torch": torch.__version__,
                        "transformers": package_version("transformers"),
                    },
                    produces=(f"exported-{precision}",),
                )
            )
        if any(v.name == f"aoti-{precision}" for v in variants):
            out.append(
                Stage(
                    name=f"aoti_{precision}",
                    version=2,  # CHANGELOG.md, "Stage versions"
                    config=AotiConfig.from_recipe(recipe, precision),
                    run=_aoti,
                    environment=aoti_environment(recipe.export.pt2.device),
                    consumes=(f"exported-{precision}",),
                    produces=(f"aoti-{precision}",),
                    placement=BACKGROUND,  # half a minute or more of compiling in a child: validate goes on meanwhile
                )
            )
    return out
