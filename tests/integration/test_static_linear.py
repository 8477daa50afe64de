"""Linear layers with static scales on the compiled PyTorch path, FP8 (`_scaled_mm`) and INT8 (`_int_mm`): a
calibrated layer stays close to its float twin and saturates beyond its calibrated range; GPT-2's Conv1D layers
take them as nn.Linear layers do; a deploy refuses a model with no layer the GEMM takes (the deploy that builds
and validates `exported-fp8` and `exported-int8` shares the packed program's, in test_packed_pt2.py). On a GPU
the AOTInductor packages pass in a CUDA graph."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn

from pipeline.recipe import Tolerance
from pipeline.report.blocks import Document
from pipeline.report.markdown import markdown_from
from pipeline.report.mixed import static_mix_section
from pipeline.stages.export_pt2 import KeepIoTypes
from pipeline.stages.static_mix import StaticMix, chosen_layers
from pipeline.toolchain.fp8_linear import Fp8Linear, fp8_gemm_runs, to_fp8
from pipeline.toolchain.int8_linear import Int8Linear, to_int8
from pipeline.toolchain.static_linear import input_amax, quantizable
from tests.integration.test_deploy_cli import cli
from tests.integration.test_packed import _recipe
from tests.zoo import models as zoo

ZOO = Path(__file__).parents[1] / "zoo" / "recipes"
KINDS = {"fp8": (Fp8Linear, to_fp8, "weight_fp8"), "int8": (Int8Linear, to_int8, "weight_int8")}


def _cosine(a: torch.Tensor, b: torch.Tensor) -> float:
    return float(
        nn.functional.cosine_similarity(a.detach().flatten().float(), b.detach().flatten().float(), dim=0)
    )


@pytest.mark.parametrize("precision", sorted(KINDS))
def test_a_calibrated_layer_follows_its_linear_and_saturates_past_its_range(precision: str) -> None:
    kind, swap, stored = KINDS[precision]
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 32), nn.GELU(), nn.Linear(32, 48), nn.Linear(48, 3))
    assert sorted(quantizable(model)) == ["0", "2"]  # 3 outputs: not a width the GEMMs take
    calibration = [(torch.randn(16, 64),) for _ in range(4)]
    amax = input_amax(model, calibration)
    assert set(amax) == {"0", "2"} and amax["0"] == max(float(b[0].abs().max()) for b in calibration)
    reference = model(calibration[0][0])
    original = model[0].weight.detach().clone()
    swapped = swap(model.half(), amax, torch.float16)
    assert swapped == ["0", "2"] and isinstance(model[0], kind) and type(model[3]) is nn.Linear
    assert getattr(model[0], stored).dtype == {"fp8": torch.float8_e4m3fn, "int8": torch.int8}[precision]
    assert _cosine(model(calibration[0][0].half()), reference) > 0.995
    single = calibration[0][0][:1]  # one row: INT8's GEMM pads to 17 rows on a GPU and slices back
    assert _cosine(model(single.half()), reference[:1]) > 0.99
    layer = model[0]
    # model code reading its layer's weight (T5 casts to its dtype) sees it dequantized, in the compute dtype
    assert layer.weight.dtype == torch.float16 and layer.weight.shape == (32, 64)
    assert _cosine(layer.weight, original) > 0.999
    assert (layer.in_features, layer.out_features) == (64, 32)
    beyond = torch.full((1, 64), 100.0 * amax["0"], dtype=torch.float16)
    at_range = torch.full((1, 64), amax["0"], dtype=torch.float16)
    torch.testing.assert_close(layer(beyond), layer(at_range))  # inputs past the calibrated range saturate
    upcast = layer(at_range.float())  # a model that upcasts before a layer gets its dtype back
    assert upcast.dtype == torch.float32 and torch.allclose(upcast, layer(at_range).float())


@pytest.mark.parametrize("precision", sorted(KINDS))
def test_the_simulated_layer_computes_what_its_gemm_does(precision: str) -> None:
    """The layer mixes are measured with (static_mix.py) computes the 8-bit GEMM's result in FP32."""
    kind, _, _ = KINDS[precision]
    torch.manual_seed(1)
    layer = kind(nn.Linear(64, 48), input_amax=2.0, dtype=torch.float32)
    rows = 3.0 * torch.randn(40, 64)  # some past the calibrated range: saturated by both
    gemm = layer(rows)
    layer.simulate = True
    simulated = layer(rows)
    torch.testing.assert_close(simulated, gemm, rtol=1e-5, atol=1e-5)
    assert _cosine(simulated, nn.functional.linear(rows, layer.weight.float(), layer.bias)) < 0.9999


def test_int8_weights_are_scaled_per_output_channel() -> None:
    """A channel of large weights keeps the small ones from rounding to zero: each row has its own scale."""
    linear = nn.Linear(32, 16)
    with torch.no_grad():
        linear.weight[0] *= 1000.0
    layer = Int8Linear(linear, input_amax=1.0, dtype=torch.float32)
    assert layer.weight_scale.shape == (16,)
    assert (layer.weight_int8[1:].abs().amax(dim=1) == 127).all()
    assert _cosine(layer.weight[1:], linear.weight[1:]) > 0.9999


def test_a_model_without_a_layer_fp8_takes_fails_its_variant_with_the_reason(tmp_path: Path) -> None:
    sets = ["--set", "variants.build=[exported-fp8]", "--set", "variants.required=[exported-fp8]"]
    result = cli("deploy", str(ZOO / "mobilenet.yaml"), *sets, root=tmp_path / "out")
    assert result.returncode != 0  # the one variant asked for failed
    out = result.stdout + result.stderr
    assert "exported-fp8" in out and "no linear layer FP8's GEMM takes" in out, out[-3000:]


@pytest.mark.gpu
@pytest.mark.parametrize("precision", sorted(KINDS))
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_on_a_gpu_the_8_bit_package_passes_in_a_cuda_graph(tmp_path: Path, precision: str) -> None:
    if precision == "fp8" and not fp8_gemm_runs():
        pytest.skip("needs a GPU with FP8 tensor cores")
    recipe = _recipe(tmp_path, "bert", "last_hidden_state")
    variants = f"variants.build=[onnx-fp32, exported-{precision}, aoti-{precision}]"
    result = cli("deploy", str(recipe), "--set", variants, root=tmp_path / "out")
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    accuracy = json.loads((tmp_path / "out" / "packed" / "v0001" / "reports" / "accuracy.json").read_text())
    assert accuracy["artifacts"][f"aoti-{precision}"]["runtimes"]["torch-aoti-cuda-graph"]["passed"] is True


@pytest.mark.parametrize("precision", sorted(KINDS))
def test_gpt2s_conv1d_layers_take_8_bits_as_linear_layers_do(precision: str) -> None:
    _, swap, _ = KINDS[precision]
    model = zoo.gpt2().eval()
    ids = torch.randint(0, 500, (4, 16), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        reference = model(ids).logits
        amax = input_amax(model, [(ids,)])
        swapped = swap(model.half(), amax, torch.float16)
        assert "transformer.h.0.attn.c_attn" in swapped and "transformer.h.0.mlp.c_proj" in swapped
        attention = model.transformer.h[0].attn.c_attn
        assert attention.weight.shape == (32, 96) and attention.nf == 96  # Conv1D's own layout and names
        assert _cosine(model(ids).logits, reference) > 0.99


@pytest.mark.parametrize("precision", sorted(KINDS))
def test_a_layer_with_outlier_inputs_stays_in_float_and_the_rest_go_to_8_bits(precision: str) -> None:
    """One layer's input has a channel a million times the rest, which the layer's weights ignore: a per-tensor
    scale crushes its other channels to zero, so that layer alone fails the gate. The mix measures each layer's
    sensitivity and keeps exactly that one in float."""
    _, swap, _ = KINDS[precision]
    torch.manual_seed(2)
    model = nn.Sequential(
        nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 64), nn.Linear(64, 32), nn.Linear(32, 16)
    )
    with torch.no_grad():
        model[0].bias[5] = 1e6  # channel 5 of layer 2's input
        model[2].weight[:, 5] = 0.0
    feeds = [{"x": np.random.default_rng(i).standard_normal((8, 32)).astype(np.float32)} for i in range(6)]
    batches = [(torch.from_numpy(f["x"]),) for f in feeds]
    amax = input_amax(model, batches)
    mix = StaticMix(
        model,
        lambda m: KeepIoTypes(m, torch.float32),
        batches,
        feeds,
        ["y"],
        Tolerance(cosine=0.995),
        (None, 0),
    )
    assert not mix.verdict(sorted(amax), amax, swap)[0]  # every layer in 8 bits fails
    reports: list[str] = []
    layers, details = chosen_layers(mix, amax, swap, precision.upper(), reports.append)
    assert details["kept_float"] == ["2"] and sorted(layers) == ["0", "3", "4"], details
    assert details["sensitivity"]["2"] > 1.0 > max(details["sensitivity"][n] for n in ("0", "3", "4"))
    assert len(reports) == 4  # progress per layer measured
    assert mix.verdict(layers, amax, swap)[0]
    artifact = {
        "name": f"exported-{precision}",
        "precision": precision,
        "details": {f"{precision}_mix": details},
    }
    text = markdown_from(Document("t", "s", True, [static_mix_section({"artifacts": [artifact]})]))
    rows = [line for line in text.splitlines() if line.startswith("| ") and line[2].isdigit()]
    assert rows[0].startswith("| 2 |") and rows[0].endswith("| no (kept in FP16) |"), (
        text
    )  # most sensitive first
    assert all(row.endswith("| yes |") for row in rows[1:]) and len(rows) == 4, text
