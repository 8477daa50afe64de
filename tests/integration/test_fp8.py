"""FP8 with static scales on the compiled PyTorch path: a calibrated FP8 layer stays close to its FP16 twin
and saturates beyond its calibrated range; a deploy refuses a model with no layer FP8's GEMM takes (the deploy
that builds and validates `exported-fp8` shares the packed program's, in test_packed_pt2.py). On a GPU with FP8
tensor cores the AOTInductor package passes in a CUDA graph."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from torch import nn

from pipeline.toolchain.fp8_linear import Fp8Linear, fp8_gemm_runs, input_amax, quantizable, to_fp8
from tests.integration.test_deploy_cli import cli
from tests.integration.test_packed import _recipe
from tests.zoo import models as zoo

ZOO = Path(__file__).parents[1] / "zoo" / "recipes"


def _cosine(a: torch.Tensor, b: torch.Tensor) -> float:
    return float(
        nn.functional.cosine_similarity(a.detach().flatten().float(), b.detach().flatten().float(), dim=0)
    )


def test_a_calibrated_fp8_layer_follows_its_linear_and_saturates_past_its_range() -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 32), nn.GELU(), nn.Linear(32, 48), nn.Linear(48, 3))
    assert sorted(quantizable(model)) == ["0", "2"]  # 3 outputs: not a width FP8's GEMM takes
    calibration = [(torch.randn(16, 64),) for _ in range(4)]
    amax = input_amax(model, calibration)
    assert set(amax) == {"0", "2"} and amax["0"] == max(float(b[0].abs().max()) for b in calibration)
    reference = model(calibration[0][0])
    swapped = to_fp8(model.half(), amax, torch.float16)
    assert swapped == ["0", "2"] and isinstance(model[0], Fp8Linear) and type(model[3]) is nn.Linear
    assert model[0].weight_fp8.dtype == torch.float8_e4m3fn
    assert _cosine(model(calibration[0][0].half()), reference) > 0.995
    layer = model[0]
    # model code reading its layer's weight (T5 casts to its dtype) sees it dequantized, in the compute dtype
    assert layer.weight.dtype == torch.float16 and layer.weight.shape == (32, 64)
    assert (layer.in_features, layer.out_features) == (64, 32)
    beyond = torch.full((1, 64), 100.0 * amax["0"], dtype=torch.float16)
    at_range = torch.full((1, 64), amax["0"], dtype=torch.float16)
    torch.testing.assert_close(layer(beyond), layer(at_range))  # inputs past the calibrated range saturate
    upcast = layer(at_range.float())  # a model that upcasts before a layer gets its dtype back
    assert upcast.dtype == torch.float32 and torch.allclose(upcast, layer(at_range).float())


def test_a_model_without_a_layer_fp8_takes_fails_its_variant_with_the_reason(tmp_path: Path) -> None:
    sets = ["--set", "variants.build=[exported-fp8]", "--set", "variants.required=[exported-fp8]"]
    result = cli("deploy", str(ZOO / "mobilenet.yaml"), *sets, root=tmp_path / "out")
    assert result.returncode != 0  # the one variant asked for failed
    out = result.stdout + result.stderr
    assert "exported-fp8" in out and "no linear layer FP8's GEMM takes" in out, out[-3000:]


@pytest.mark.gpu
@pytest.mark.skipif(not fp8_gemm_runs(), reason="needs a GPU with FP8 tensor cores")
def test_on_a_hopper_gpu_the_fp8_package_passes_in_a_cuda_graph(tmp_path: Path) -> None:
    recipe = _recipe(tmp_path, "bert", "last_hidden_state")
    variants = "variants.build=[onnx-fp32, exported-fp8, aoti-fp8]"
    result = cli("deploy", str(recipe), "--set", variants, root=tmp_path / "out")
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    accuracy = json.loads((tmp_path / "out" / "packed" / "v0001" / "reports" / "accuracy.json").read_text())
    assert accuracy["artifacts"]["aoti-fp8"]["runtimes"]["torch-aoti-cuda-graph"]["passed"] is True


def test_gpt2s_conv1d_layers_take_fp8_as_linear_layers_do() -> None:
    model = zoo.gpt2().eval()
    ids = torch.randint(0, 500, (4, 16), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        reference = model(ids).logits
        amax = input_amax(model, [(ids,)])
        swapped = to_fp8(model.half(), amax, torch.float16)
        assert "transformer.h.0.attn.c_attn" in swapped and "transformer.h.0.mlp.c_proj" in swapped
        attention = model.transformer.h[0].attn.c_attn
        assert attention.weight.shape == (32, 96) and attention.nf == 96  # Conv1D's own layout and names
        assert _cosine(model(ids).logits, reference) > 0.99
