"""Packed tokens on the compiled PyTorch path: the varlen layout holds every real token once and every sentence
as one span; the packed model with span attention reproduces the padded one (encoders, causal decoders,
grouped-query attention); a deploy builds, validates and times the packed program on its own runtime, and its
card's loading snippet runs as written. On a CUDA host the program holds FlashAttention's varlen kernel."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from pipeline.core.packing import FLASH_VARLEN, Packing
from pipeline.inputs.packed_model import PackedModel, check_exact, position_rule
from pipeline.report.card import load_snippet
from pipeline.stages.export_packed_pt2 import MASKED, savable
from pipeline.toolchain.fp8_linear import fp8_gemm_runs
from tests.integration.test_deploy_cli import cli
from tests.integration.test_packed import NAMES, _bound, _llama, _padded, _recipe
from tests.zoo import models as zoo


def _varlen(module: torch.nn.Module, bucket: int = 8) -> Packing:
    rule, offset = position_rule(module)
    return Packing(
        "attention_mask", ("input_ids",), rule, offset, attention="varlen", bucket=bucket, longest=16
    )


def _attention_of(path: Path) -> str:
    flash = torch.ops.aten._flash_attention_forward.default
    nodes = torch.export.load(str(path)).graph.nodes
    return FLASH_VARLEN if any(n.target is flash for n in nodes) else MASKED


def test_a_per_token_input_with_features_packs_with_its_features() -> None:
    feeds = _padded(3, 8, seed=1)
    feeds["features"] = np.random.default_rng(0).normal(size=(3, 8, 5)).astype(np.float32)
    packing = Packing("attention_mask", ("input_ids", "features"), attention="varlen", bucket=8, longest=8)
    packed = packing.pack(feeds)
    real = feeds["attention_mask"] != 0
    real[:, 0] |= ~real.any(axis=1)
    row = packed["input_ids"].shape[1]
    assert packed["features"].shape == (1, row, 5)
    assert np.array_equal(packed["features"][0, : int(real.sum())], feeds["features"][real])


def test_the_varlen_layout_holds_each_sentence_as_one_span() -> None:
    feeds = _padded(7, 12, seed=3)
    packed = Packing("attention_mask", ("input_ids",), attention="varlen", bucket=8, longest=12).pack(feeds)
    real = feeds["attention_mask"] != 0
    real[:, 0] |= ~real.any(axis=1)  # the empty row keeps one token
    tokens = int(real.sum())
    row = packed["input_ids"].shape[1]
    assert row % 8 == 0 and tokens < row <= tokens + 8  # filler up to the bucket, at least one token of it
    assert np.array_equal(packed["input_ids"][0, :tokens], feeds["input_ids"][real])
    cu = packed["pack_cu"]
    assert cu.dtype == np.int32 and np.array_equal(cu, [0, *np.cumsum(real.sum(axis=1)), row])
    layout = packed["pack_layout"]
    assert np.array_equal(layout[real], np.arange(tokens)) and (layout[~real] == row).all()  # past the filler
    assert "pack_tokens" not in packed and not any(name.startswith("pack_grid") for name in packed)


@pytest.mark.parametrize(
    ("factory", "output"),
    [
        (zoo.bert, "last_hidden_state"),
        (zoo.roberta, "last_hidden_state"),  # positions from the padding index
        (zoo.gpt2, "logits"),  # causal
        (_llama, "last_hidden_state"),  # causal, grouped-query attention
    ],
    ids=["bert", "roberta", "gpt2", "llama"],
)
def test_span_attention_reproduces_the_padded_model(factory, output: str) -> None:
    module = _bound(factory, [output])
    packing = _varlen(module)
    packed = PackedModel(module, packing, NAMES, [output]).eval()
    pad = getattr(module.inner.config, "pad_token_id", None) or 0
    with torch.inference_mode():
        for seed in range(2):
            assert check_exact(module, packed, _padded(6, 16, seed, pad), packing, [output]) is None


def test_a_span_layout_with_the_wrong_positions_is_caught() -> None:
    module = _bound(zoo.roberta, ["last_hidden_state"])
    packing = Packing("attention_mask", ("input_ids",), attention="varlen", bucket=8, longest=16)  # by column
    packed = PackedModel(module, packing, NAMES, ["last_hidden_state"]).eval()
    with torch.inference_mode():
        problem = check_exact(module, packed, _padded(4, 16, 0, 1), packing, ["last_hidden_state"])
    assert problem and problem.startswith("output 'last_hidden_state' differs by")


def test_a_program_holding_the_flash_kernel_saves_where_the_serializer_has_no_uint64(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """torch 2.11's serializer has no uint64 (the kernel's unused RNG state); the H200's deploy failed on it."""
    from torch._export.serde import serialize
    from torch._subclasses.fake_tensor import FakeTensorMode

    class Spans(torch.nn.Module):
        def forward(self, q: torch.Tensor, cu: torch.Tensor) -> torch.Tensor:
            return torch.ops.aten._flash_attention_forward(q, q, q, cu, cu, 64, 64, 0.0, False, False)[0]

    with FakeTensorMode(allow_non_fake_inputs=True):  # a CUDA program traced without a GPU
        q = torch.empty(128, 4, 32, device="cuda", dtype=torch.float16)
        cu = torch.tensor([0, 50, 128], dtype=torch.int32, device="cuda")
        program = torch.export.export(Spans(), (q, cu), strict=False)
    program.example_inputs = None  # fake tensors: loading them back is not what is checked here
    monkeypatch.delitem(serialize._TORCH_TO_SERIALIZE_DTYPE, torch.uint64)
    with pytest.raises(Exception, match="_flash_attention_forward"):
        torch.export.save(program, str(tmp_path / "as_traced.pt2"))
    torch.export.save(savable(program), str(tmp_path / "spans.pt2"))
    monkeypatch.undo()
    assert _attention_of(tmp_path / "spans.pt2") == FLASH_VARLEN


def test_a_deploy_builds_validates_and_times_the_packed_program(tmp_path: Path) -> None:
    """One deploy for three variants of the compiled path: the packed program and the FP8 and INT8 ones
    (_check_static)."""
    recipe = _recipe(tmp_path, "roberta", "last_hidden_state")
    result = cli(
        "deploy",
        str(recipe),
        "--set",
        "variants.build=[onnx-fp32, exported-packed-fp16, exported-fp8, exported-int8]",
        # timed at the objective's batch alone, unprofiled: each profile loads an exported program again (a
        # second a row here), and this test reads neither
        "--set",
        "benchmark.batch_sizes=[8]",
        "--set",
        "benchmark.profile=false",
        root=tmp_path / "out",
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    version = tmp_path / "out" / "packed" / "v0001"
    manifest = json.loads((version / "manifest.json").read_text())
    _check_static(version, manifest, "fp8", torch.ops.aten._scaled_mm.default)
    _check_static(version, manifest, "int8", torch.ops.aten._int_mm.default)
    entry = next(a for a in manifest["artifacts"] if a["name"] == "exported-packed-fp16")
    assert entry["kind"] == "exported-packed"
    on_gpu = torch.cuda.is_available()
    # what the record says is what the saved graph holds: the kernel on a GPU, the mask here
    assert entry["details"]["attention"] == _attention_of(version / entry["path"])
    assert entry["details"]["attention"] == (FLASH_VARLEN if on_gpu else MASKED)
    assert entry["details"]["packing"]["attention"] == "varlen"
    assert entry["details"]["packing"]["positions"] == "offset"  # RoBERTa's numbering, found from the model
    accuracy = json.loads((version / "reports" / "accuracy.json").read_text())
    runtime = "torch-cuda" if on_gpu else "torch-cpu"
    assert accuracy["artifacts"]["exported-packed-fp16"]["runtimes"][runtime]["passed"] is True
    speed = json.loads((version / "reports" / "speed.json").read_text())
    rows = [r for r in speed["results"] if r["artifact"] == "exported-packed-fp16" and r["batch"] == 8]
    assert rows and rows[0]["runtime"] == runtime
    packing = rows[0]["runtime_details"]["packing"]
    assert 0 < packing["real_tokens"] < packing["padded_tokens"] == 8 * 16
    # the card's snippet loads the file and runs a batch as written
    snippet = load_snippet(
        manifest, {**entry, "artifact": entry["name"], "file": str(version / entry["path"])}, NAMES
    )
    assert snippet is not None
    feeds = _padded(3, 16, seed=5, pad_id=1)
    scope: dict = dict(feeds)
    exec(snippet, scope)  # noqa: S102 - the product's own text, run as a user would paste it
    assert scope["outputs"][0].shape == (3, 16, 32)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_on_a_gpu_the_package_holds_the_varlen_kernel_and_passes_in_a_cuda_graph(tmp_path: Path) -> None:
    recipe = _recipe(tmp_path, "bert", "last_hidden_state")
    variants = "variants.build=[onnx-fp32, exported-packed-fp16, aoti-packed-fp16]"
    result = cli("deploy", str(recipe), "--set", variants, root=tmp_path / "out")
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    version = tmp_path / "out" / "packed" / "v0001"
    manifest = json.loads((version / "manifest.json").read_text())
    entry = next(a for a in manifest["artifacts"] if a["name"] == "aoti-packed-fp16")
    assert entry["details"]["attention"] == FLASH_VARLEN
    exported = next(a for a in manifest["artifacts"] if a["name"] == "exported-packed-fp16")
    assert _attention_of(version / exported["path"]) == FLASH_VARLEN  # the kernel is in the graph itself
    accuracy = json.loads((version / "reports" / "accuracy.json").read_text())
    validated = accuracy["artifacts"]["aoti-packed-fp16"]["runtimes"]
    assert validated["torch-aoti-cuda-graph"]["passed"] is True


def _check_static(version: Path, manifest: dict, precision: str, gemm: object) -> None:
    """`exported-fp8` / `exported-int8`: its linear layers are calls of the 8-bit GEMM, validated on its own
    runtime by 8-bit gates."""
    if precision == "fp8" and torch.cuda.is_available() and not fp8_gemm_runs():
        return  # a GPU without FP8 tensor cores: not runnable here, and said so (pipeline/runners/pt2.py)
    name = f"exported-{precision}"
    entry = next(a for a in manifest["artifacts"] if a["name"] == name)
    assert entry["kind"] == "exported" and entry["precision"] == precision
    layers = entry["details"][f"{precision}_layers"]
    assert "attention.self.query" in " ".join(layers)
    nodes = torch.export.load(str(version / entry["path"])).graph.nodes
    assert len([n for n in nodes if n.target is gemm]) == len(layers)
    accuracy = json.loads((version / "reports" / "accuracy.json").read_text())
    runtime = "torch-cuda" if torch.cuda.is_available() else "torch-cpu"
    checked = accuracy["artifacts"][name]
    assert checked["runtimes"][runtime]["passed"] is True
    cosines = [c for c in checked["checks"] if c["metric"] == "cosine" and c["runtime"] == runtime]
    assert cosines and all(c["threshold"] == 0.98 and c["passed"] for c in cosines)  # 8-bit gates, not FP16's
