"""Export settings per format, and which variants to build."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field

from pipeline.recipe.base import BuildSeconds, ErrorBound, Strict, VariantName
from pipeline.recipe.sources import DimRange


class TorchScriptExport(Strict):
    check_corners: list[Literal["min", "opt", "max"]] = Field(
        ["min", "opt", "max"], description="shape corners at which the traced module is checked against eager"
    )
    check_atol: ErrorBound = Field(
        1e-4,
        description="largest absolute difference the trace check allows at unit scale: multiplied by "
        "max(1, largest |output|), and by 10 on a CUDA device (TF32 off); at most 1e6",
    )
    freeze: bool = Field(True, description="torch.jit.freeze the traced module")


class OnnxExport(Strict):
    exporter: Literal["dynamo", "legacy"] = Field("dynamo", description="torch.onnx exporter to use")
    fallback: bool = Field(True, description="fall back to the legacy exporter when dynamo fails")
    opset: Annotated[int, Field(ge=13, le=23)] = Field(18, description="ONNX opset version")


class Fp16Export(Strict):
    keep_io_types: bool = Field(True, description="keep FP32 graph inputs and outputs (casts inside)")
    block_ops: list[str] = Field(
        ["ReduceMean", "ReduceSum", "Pow", "Sqrt", "Softmax", "Exp", "Log", "Erf"],
        description="op types kept in FP32 (they overflow or lose precision in FP16)",
    )


class Int8Export(Strict):
    calibration: Literal["minmax", "entropy", "percentile"] = Field(
        "minmax", description="calibration method (on the calibration split only)"
    )
    percentile: Annotated[float, Field(gt=90, le=100)] = Field(
        99.99, description="percentile kept by percentile calibration"
    )
    op_types: list[str] = Field(
        ["Conv", "MatMul", "Gemm"],
        description="op types to quantize; default by model family: transformer [MatMul, Gemm], generic "
        "[Conv, MatMul, Gemm]",
    )
    weights_only_matmul: bool = Field(
        True, description="quantize only MatMuls with a constant (weight) input, not activation x activation"
    )
    include: list[str] = Field(
        [],
        description="fnmatch patterns on the module path that owns each op ('*' crosses dots); when given, "
        "only matching ops are quantized",
    )
    exclude: list[str] = Field(
        [],
        description="fnmatch patterns on the owning module path of ops kept in float; each must match a "
        "module of the model",
    )
    exclude_feed_forward: bool = Field(
        False,
        description="keep every feed-forward block's two linears (around its activation, found from the "
        "graph) in float: quantizing them costs encoders most of their INT8 accuracy; default by model "
        "family: transformer true, generic false",
    )
    quantizer: Literal["onnxruntime"] = Field(
        "onnxruntime",
        description="quantization library: ONNX Runtime's static Q/DQ quantizer (NVIDIA ModelOpt is not "
        "offered: its [onnx] extra replaces the CPU onnxruntime, and a quantizer is not added unverified)",
    )


class OptimizeExport(Strict):
    model_type: str | None = Field(
        None,
        description="ONNX Runtime transformer optimizer model type (bert, gpt2, vit, ...); null: none of that "
        "optimizer's fusions (onnxscript's, in fusions, still apply); default by model family: transformer bert, "
        "generic null",
    )
    opt_level: Annotated[int, Field(ge=0, le=2)] = Field(2, description="ONNX Runtime optimization level")
    fusions: list[Literal["onnxscript", "transformers"]] = Field(
        ["onnxscript", "transformers"],
        description="graph fusions, in order: onnxscript's ONNX Runtime fusions (Attention, "
        "SkipLayerNormalization, BiasGelu on dynamo exports), then ONNX Runtime's transformers optimizer",
    )


class EngineProfile(Strict):
    """Dims not named here take the recipe's top-level min/opt/max."""

    dims: dict[str, DimRange] = Field({}, description="min/opt/max per dim for this optimization profile")


class TensorRTExport(Strict):
    flavour: Literal["auto", "tensorrt", "tensorrt-rtx"] = Field(
        "auto", description="auto: tensorrt if installed, else tensorrt-rtx"
    )
    optimization_level: Annotated[int, Field(ge=0, le=5)] = Field(3, description="builder optimization level")
    workspace_mb: Annotated[int, Field(gt=0, le=262_144)] = Field(
        2048,
        description="builder workspace memory limit, MiB; at most 262144 (256 GiB, above any GPU's memory)",
    )
    compute_capabilities: list[Annotated[str, Field(pattern=r"^sm\d{2,3}$")]] = Field(
        ["sm89"], description="TensorRT-RTX ahead-of-time targets (sm75 ... sm121)"
    )
    profiles: Annotated[list[EngineProfile], Field(max_length=16)] = Field(
        [EngineProfile()],
        description="optimization profiles (one by default: the recipe's dims); at most 16, as each one "
        "multiplies the builder's tactic search",
    )
    build_timeout_s: BuildSeconds = Field(
        900, description="a build running longer fails its variant; at most 86400 (a day)"
    )


class Pt2Export(Strict):
    """torch.export / AOTInductor settings. `attention`: the attention kernel a transformers model is exported
    with (sdpa lowers to fused flash / memory-efficient kernels; the ONNX exports keep eager)."""

    attention: Literal["sdpa", "eager"] = Field(
        "sdpa", description="attention implementation the model is exported with (sdpa: fused kernels)"
    )
    device: Literal["auto", "cpu", "cuda"] = Field(
        "auto", description="AOTInductor target device; auto: cuda where present, else cpu"
    )
    max_autotune: bool = Field(
        False,
        description="AOTInductor's GEMM autotuning (Triton templates): minutes of compile; on an H100 it made "
        "MiniLM's packages slower (docs/gpu.md)",
    )
    fuse_projections: bool = Field(
        True, description="one GEMM for linears reading one tensor (Q, K, V): fewer kernel launches"
    )
    gelu_epilogue: bool = Field(
        True,
        description="in FP16 programs compiled for a GPU, a linear layer read only by GELU as one cuBLASLt GEMM "
        "with bias and GELU in its epilogue (GELU's tanh approximation, at most 4.8e-4 from the exact one): one "
        "kernel fewer per feed-forward layer; the program's other GELUs (after 8-bit GEMMs, convolutions) take "
        "the same tanh form (after FP8 GEMMs measured cheaper than erf: docs/gpu.md)",
    )
    conv_epilogue: bool = Field(
        True,
        description="in FP16 programs compiled for a GPU, each 2-D convolution with its batch norm (folded), "
        "residual add and ReLU as one cuDNN call with those in its epilogue: the activation is written once "
        "(torchvision ResNet-50 ran 9 to 11% faster on an H100)",
    )
    memory_format: Literal["auto", "channels_last", "contiguous"] = Field(
        "auto",
        description="layout of the compiled model's 2-D convolutions: channels_last (NHWC, the layout cuDNN's "
        "and oneDNN's fast kernels use; the graph converts its 4-D inputs itself) or contiguous; auto: "
        "channels_last for a model with Conv2d layers and a 4-D floating input",
    )
    compile_timeout_s: BuildSeconds = Field(
        1800, description="an AOTInductor compile running longer fails its variant; at most 86400 (a day)"
    )


class ExportConfig(Strict):
    torchscript: TorchScriptExport = Field(TorchScriptExport(), description="TorchScript trace settings")
    onnx: OnnxExport = Field(OnnxExport(), description="ONNX export settings")
    fp16: Fp16Export = Field(Fp16Export(), description="FP16 conversion settings")
    int8: Int8Export = Field(Int8Export(), description="INT8 quantization settings")
    optimize: OptimizeExport = Field(OptimizeExport(), description="ONNX Runtime optimizer settings")
    tensorrt: TensorRTExport = Field(TensorRTExport(), description="TensorRT engine build settings")
    pt2: Pt2Export = Field(Pt2Export(), description="torch.export and AOTInductor settings")
    triton: bool = Field(
        False,
        description="write a Triton Inference Server model repository of the winner under triton/ in the "
        "version folder",
    )
    triton_queue_delay_us: Annotated[int, Field(ge=0, le=10_000_000)] = Field(
        0,
        description="the Triton repository's dynamic batcher: how long a request may wait for a fuller batch, "
        "microseconds (0: only requests already queued are batched)",
    )


class VariantsConfig(Strict):
    build: Annotated[list[VariantName], Field(min_length=1)] = Field(
        ["torchscript-fp32", "onnx-fp32"],
        description="variants to build; engine-<precision> takes the resolved TensorRT flavour",
    )
    required: list[VariantName] = Field(
        [], description="variants whose failure fails the sign-off (exit 1); each must be in build"
    )
    allow_failed: bool = Field(
        True,
        description="false: any requested variant that fails to build, validate or benchmark fails the "
        "sign-off (exit 1); true: failures are listed and the rest may still be signed off",
    )
    gpu: list[VariantName] = Field(
        default=[], description="built only where the deploy host has a CUDA GPU (else reported as not built)"
    )
