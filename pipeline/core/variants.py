"""The variant-name grammar, in one place: what every artifact name means and where its file lies.

A name reads `<format>[-<flavour>]-<precision>`: `onnx-fp16`, `onnx-optimized-fp32`, `tensorrt-rtx-int8`,
`aoti-bf16`; `onnx-int8-dynamic` and `onnx-int8-mixed` are the names with their flavour after the precision. A recipe may write
`engine-<precision>`: the engine in the flavour export.tensorrt.flavour resolves to, named by that flavour once
resolved. `parse` is the only function that reads a name; everything else asks the Variant it returns.
Pure: no imports of the rest of the pipeline, no I/O.
"""

from __future__ import annotations

from dataclasses import dataclass

REFERENCE = "torch-fp32"  # the eager PyTorch FP32 model every artifact is compared with: not a file
PLAIN_EXPORTS = ("onnx-fp32", "torchscript-fp32")  # what a release manager sets any winner's cost against
# artifact kinds, as manifest.json says; a packed graph takes packed feeds (pipeline/core/packing.py), so it is
# a kind of its own: nothing that feeds an ONNX graph the recipe's inputs may take it for one
FORMATS = (
    "torchscript",
    "onnx",
    "onnx-packed",
    "engine",
    "exported",
    "aoti",
    "exported-packed",
    "aoti-packed",
)
PRECISIONS = ("fp32", "fp16", "bf16", "int8", "fp8")
ENGINE_FLAVOURS = ("tensorrt", "tensorrt-rtx")
VARIANTS = (
    "torchscript-fp32",
    "onnx-fp32",
    "onnx-fp16",
    "onnx-int8",  # static Q/DQ, calibrated: the graph TensorRT's INT8 engine is built from
    "onnx-int8-dynamic",  # dynamic quantization, for ONNX Runtime on the CPU
    "onnx-int8-mixed",  # dynamic quantization of the layers chosen by measured accuracy and speed
    "onnx-optimized-fp32",  # ONNX Runtime's fused graphs, for ONNX Runtime only
    "onnx-optimized-fp16",
    "onnx-packed-fp32",  # real tokens only, attention per sentence: for padded text (runtime.padding)
    "onnx-packed-fp16",
    "engine-fp32",  # a TensorRT engine in the flavour export.tensorrt.flavour resolves to
    "engine-fp16",
    "engine-int8",
    "tensorrt-fp32",
    "tensorrt-fp16",
    "tensorrt-int8",
    "tensorrt-rtx-fp32",
    "tensorrt-rtx-fp16",
    "tensorrt-rtx-int8",
    "exported-fp32",  # torch.export ExportedProgram
    "exported-fp16",
    "exported-bf16",
    "exported-fp8",  # FP16 with its linear layers in FP8, scales calibrated (Hopper's FP8 tensor cores)
    # FP16 with its linear layers in INT8, scales calibrated, for a GPU's INT8 tensor cores (torch's INT8 GEMM on
    # a CPU is a slow reference: MiniLM at batch 1 took 0.5 s on this CPU; CPU hosts have onnx-int8-*)
    "exported-int8",
    "aoti-fp32",  # AOTInductor package compiled for the deploy host's device
    "aoti-fp16",
    "aoti-bf16",
    "aoti-fp8",
    "aoti-int8",
    "exported-packed-fp16",  # packed tokens, variable-length attention (FlashAttention's on a GPU)
    "aoti-packed-fp16",
)
_ENGINE_PREFIXES = ("engine", *ENGINE_FLAVOURS)
DYNAMIC = (
    "dynamic",
    "mixed",
)  # flavours of dynamically quantized ONNX graphs (MatMulInteger, ONNX Runtime only)


@dataclass(frozen=True)
class Variant:
    """One artifact the recipe can ask for.

    name: the contract's artifact name (an `engine-<p>` request takes its resolved flavour's name);
    requested: the name as the recipe writes it; format: the artifact kind; flavour: `optimized` or
    `dynamic` for ONNX graphs, the TensorRT flavour for engines (None when `auto` found none installed)."""

    name: str
    requested: str
    format: str
    precision: str
    flavour: str | None = None

    @property
    def file(self) -> str | None:
        """The artifact's file in a version folder (None for an engine whose flavour is unknown)."""
        if self.format == "torchscript":
            return "model.ts"
        if self.format == "onnx":
            parts = ["model", *(["optimized"] if self.flavour == "optimized" else [])]
            if self.flavour in DYNAMIC:
                parts.append(f"{self.precision}-{self.flavour}")
            elif self.precision != "fp32":
                parts.append(self.precision)
            return ".".join(parts) + ".onnx"
        if self.format == "onnx-packed":
            return "model.packed.onnx" if self.precision == "fp32" else f"model.packed.{self.precision}.onnx"
        if self.format == "engine":
            return f"model.{self.flavour}.{self.precision}.engine" if self.flavour else None
        if self.format == "exported":
            return (
                "model.exported.pt2" if self.precision == "fp32" else f"model.exported.{self.precision}.pt2"
            )
        if self.format == "exported-packed":
            return f"model.exported.packed.{self.precision}.pt2"
        if self.format == "aoti-packed":
            return f"model.aoti.packed.{self.precision}.pt2"
        return f"model.aoti.{self.precision}.pt2"

    @property
    def flavour_from_setting(self) -> bool:
        """An `engine-<precision>` request: its flavour is export.tensorrt.flavour's, not its name's."""
        return self.format == "engine" and self.requested.startswith("engine-")

    @property
    def built_from(self) -> str | None:
        """The artifact this one is made from: engines and ONNX conversions from the ONNX export of their
        precision (precision lives in the graph), AOTInductor packages from the exported program."""
        if self.format == "engine":
            return f"onnx-{self.precision}"
        if self.format == "onnx" and self.name != "onnx-fp32":
            return "onnx-fp32"
        if self.format == "onnx-packed" and self.precision != "fp32":
            return "onnx-packed-fp32"
        if self.format == "aoti":
            return f"exported-{self.precision}"
        if self.format == "aoti-packed":
            return f"exported-packed-{self.precision}"
        return None

    @property
    def transformations(self) -> int:
        """Steps between the trained model and what runs: 1 a plain export, 2 one conversion (optimizer, FP16
        or packing), 3 two of them or a quantization, 4 a compiler (engines, torch.export, AOTInductor)."""
        if self.format == "onnx-packed":
            return 2 if self.precision == "fp32" else 3
        if self.format not in ("torchscript", "onnx"):
            return 4
        if self.precision == "int8" or (self.flavour == "optimized" and self.precision != "fp32"):
            return 3
        return 1 if self.flavour is None and self.precision == "fp32" else 2


def parse(name: str, engine_flavour: str | None = None) -> Variant:
    """The Variant a name stands for; `engine_flavour` resolves `engine-<p>` (None: no flavour found).
    Raises ValueError for a name outside the grammar."""
    if name not in VARIANTS:
        raise ValueError(f"not a variant name: {name!r} (known: {', '.join(VARIANTS)})")
    if name in ("onnx-int8-dynamic", "onnx-int8-mixed"):
        return Variant(name, name, "onnx", "int8", name.rpartition("-")[2])
    prefix, _, precision = name.rpartition("-")
    if prefix in _ENGINE_PREFIXES:
        flavour = engine_flavour if prefix == "engine" else prefix
        return Variant(f"{flavour}-{precision}" if flavour else name, name, "engine", precision, flavour)
    if prefix == "onnx-optimized":
        return Variant(name, name, "onnx", precision, "optimized")
    if prefix == "onnx-packed":
        return Variant(name, name, "onnx-packed", precision)
    return Variant(name, name, prefix, precision)


def precision_of(name: str) -> str | None:
    """The precision an artifact name states (the reference is FP32); None for a name outside the grammar."""
    if name == REFERENCE:
        return "fp32"
    try:
        return parse(name).precision
    except ValueError:
        return None
