"""Where BERT-base's FP8 feed-forward block can still save time on a GPU: issue 26 asks for 10.5 ms at batch 256
(32,768 tokens), and the pipeline's `aoti-fp8` row took 11.6 ms on an H100 with its GEMMs 47% of the busy time.

At that size the block is bound by memory as much as by the tensor cores: the first GEMM writes its
[tokens, 3072] output in FP16 (201 MB), which GELU and the second GEMM's input quantization read back. This
measures, on one BERT output block (LayerNorm(FFN(x) + x), hidden 768, inner 3072, GELU as BERT's):
- `fp16`: the FP16 block;
- `fp8`: the pipeline's scheme (pipeline/toolchain/fp8_linear.py): per-tensor static scales, each GEMM one
  `torch._scaled_mm` with FP16 out and the bias in its epilogue, GELU and the quantization fused by Inductor;
- `fp8-fp8-mid`: the first GEMM writes FP8 (a calibrated output scale, half the bytes), the bias added after;
- `fp8-autotune`: `fp8` compiled with max-autotune (Inductor's Triton GEMM templates, which can take GELU and the
  quantization into the first GEMM's epilogue), tuned at the size it is timed at;
- `fp8-triton`: the same with Triton's templates only (never cuBLAS), so that the epilogue is always fused;
- `fp8-mul`: the quantization a multiply by the reciprocal scale and GELU's tanh form (`fp8-recip`: erf);
  `fp8-mul-cdt` compiles it with Inductor's coordinate-descent tuning of the pointwise kernels' block sizes;
- `fp8-no-gelu`: no GELU at all (wrong, and said so by its cosine): what the pass GELU rides on costs alone.
Each compiled for its token count (torch.compile, static shapes) and replayed in a CUDA graph. Prints each
variant's lowest and mean per-token cosine against the FP32 block, and its p50 ms per token count.
Usage, on the GPU host: [KINDS="fp16 fp8 ..."] python3 scripts/gpu_fp8_ffn_peers.py [token counts, default 4096 32768]
"""

from __future__ import annotations

import copy
import os
import sys

import torch
from gpu_peers import graphed_p50_ms
from torch import nn

FP8 = torch.float8_e4m3fn
TOP = 448.0
HIDDEN, INNER = 768, 3072
TUNED = {  # kind: (the block it compiles, Inductor's settings while compiling it)
    "fp8-autotune": ("fp8", {"max_autotune": True}),
    "fp8-triton": ("fp8", {"max_autotune": True, "max_autotune_gemm_backends": "TRITON"}),
    "fp8-mul-cdt": ("fp8-mul", {"coordinate_descent_tuning": True}),
}


def scale(t: torch.Tensor) -> torch.Tensor:
    return (t.detach().abs().max().float().clamp(min=1e-12) / TOP).reshape(())


def quantized(t: torch.Tensor, s: torch.Tensor) -> torch.Tensor:
    return (t.float() / s).clamp(-TOP, TOP).to(FP8)


class Block(nn.Module):
    """BERT's intermediate and output layers in `kind`, from the FP32 `reference` and a calibration batch."""

    def __init__(self, reference: nn.ModuleDict, calibration: torch.Tensor, kind: str):
        super().__init__()
        self.kind = kind
        self.norm = nn.LayerNorm(HIDDEN).cuda().half()
        self.norm.load_state_dict(reference["norm"].state_dict())
        self.up, self.down = reference["up"], reference["down"]
        with torch.no_grad():
            middle = reference["up"](calibration)
            activated = nn.functional.gelu(middle)
        self.s_x, self.s_mid, self.s_act = scale(calibration), scale(middle), scale(activated)
        self.w_up, self.s_w_up = self._weight(self.up)
        self.w_down, self.s_w_down = self._weight(self.down)
        self.b_up, self.b_down = self.up.bias.detach().half(), self.down.bias.detach().half()
        self.up16, self.down16 = self.up.half(), self.down.half()

    @staticmethod
    def _weight(linear: nn.Linear) -> tuple[torch.Tensor, torch.Tensor]:
        w = linear.weight.detach().float()
        s = scale(w)
        return (w / s).to(FP8).t(), s  # column-major [in, out], as _scaled_mm takes it

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.kind == "fp16":
            out = self.down16(nn.functional.gelu(self.up16(x)))
            return self.norm(out + x)
        if self.kind == "fp8-fp8-mid":
            middle = torch._scaled_mm(
                quantized(x, self.s_x),
                self.w_up,
                scale_a=self.s_x,
                scale_b=self.s_w_up,
                scale_result=self.s_mid,
                out_dtype=FP8,
            )
            middle = middle.float() * self.s_mid + self.b_up.float()
        else:
            middle = torch._scaled_mm(
                quantized(x, self.s_x),
                self.w_up,
                scale_a=self.s_x,
                scale_b=self.s_w_up,
                bias=self.b_up,
                out_dtype=torch.half,
            )
        # fp8-recip: the reciprocal scale multiplied; fp8-mul: that and GELU's tanh form
        if self.kind == "fp8-no-gelu":  # not a block anyone would ship: the floor of the pass GELU rides on
            activated = quantized(middle, self.s_act)
        elif self.kind in ("fp8-mul", "fp8-recip"):
            gelu = nn.functional.gelu(middle, approximate="tanh" if self.kind == "fp8-mul" else "none")
            activated = (gelu.float() * (1.0 / self.s_act)).clamp(-TOP, TOP).to(FP8)
        else:
            activated = quantized(nn.functional.gelu(middle), self.s_act)
        out = torch._scaled_mm(
            activated,
            self.w_down,
            scale_a=self.s_act,
            scale_b=self.s_w_down,
            bias=self.b_down,
            out_dtype=torch.half,
        )
        return self.norm(out + x)


def main(token_counts: list[int]) -> None:
    print(f"{torch.cuda.get_device_name()} torch {torch.__version__}", flush=True)
    torch.manual_seed(0)
    reference = nn.ModuleDict(
        {"up": nn.Linear(HIDDEN, INNER), "down": nn.Linear(INNER, HIDDEN), "norm": nn.LayerNorm(HIDDEN)}
    ).cuda()
    calibration = torch.randn(4096, HIDDEN, device="cuda")
    check = torch.randn(2048, HIDDEN, device="cuda")
    with torch.no_grad():
        expected = reference["norm"](reference["down"](nn.functional.gelu(reference["up"](check))) + check)
    for kind in os.environ.get("KINDS", "fp16 fp8 fp8-mul fp8-fp8-mid fp8-autotune fp8-triton").split():
        built, settings = TUNED.get(kind, (kind, {}))
        block = Block(copy.deepcopy(reference), calibration, built)
        with torch.no_grad():
            got = block(check.half()).float()
        cosine = nn.functional.cosine_similarity(got, expected)
        print(
            f"{kind}: per-token cosine against FP32 lowest {cosine.min():.5f} mean {cosine.mean():.5f}",
            flush=True,
        )
        torch._dynamo.reset()
        compiled = torch.compile(block, dynamic=False)
        for tokens in token_counts:
            x = torch.randn(tokens, HIDDEN, device="cuda", dtype=torch.half)
            with torch._inductor.config.patch(settings):  # compiled on the first call, in here
                ms, seconds = graphed_p50_ms(lambda x=x, f=compiled: f(x))
            print(f"{kind}, {tokens} tokens: {ms:.3f} ms (compile and timing {seconds:.0f} s)", flush=True)


if __name__ == "__main__":
    main([int(t) for t in sys.argv[1:]] or [4096, 32768])
