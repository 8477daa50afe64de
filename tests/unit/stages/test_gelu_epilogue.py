"""The GELU-epilogue pass on small exported modules: what it rewrites, what it leaves, and that the
re-exported program computes what the model does."""

from __future__ import annotations

from pathlib import Path

import torch
import transformers
from torch import nn

from pipeline.recipe.loader import load
from pipeline.stages.export_pt2 import cuda_epilogue_on, fuse_program, gelu_epilogue_for
from pipeline.toolchain.fp8_linear import to_fp8
from pipeline.toolchain.gelu_epilogue import GELU, fuse_gelu_epilogues, tanh_gelus

ADDMM_GELU = torch.ops.aten._addmm_activation.default


class Feedforward(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.up, self.down = nn.Linear(8, 16), nn.Linear(16, 8)
        self.shared = nn.Linear(8, 16)  # read by GELU and by the output: stays a plain linear
        self.plain = nn.Linear(8, 16, bias=False)  # no bias for the epilogue to add: stays

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        shared = self.shared(x)
        y = self.down(nn.functional.gelu(self.up(x))) + nn.functional.gelu(self.plain(x)).sum(
            -1, keepdim=True
        )
        return y, nn.functional.gelu(shared) + shared


def test_only_a_biased_linear_read_by_gelu_alone_is_rewritten() -> None:
    torch.manual_seed(0)
    module = Feedforward().eval()
    dims = ({0: torch.export.Dim("rows"), 1: torch.export.Dim("columns")},)
    graph_module = torch.export.export(module, (torch.randn(2, 3, 8),), dynamic_shapes=dims).module()
    assert fuse_gelu_epilogues(graph_module) == 1
    targets = [n.target for n in graph_module.graph.nodes if n.op == "call_function"]
    assert targets.count(torch.ops.aten.gelu.default) == 2  # the shared and the unbiased linears' GELUs
    x = torch.randn(4, 5, 8)  # other leading dims than the export's: the rewrite flattens them itself
    with torch.no_grad():
        for got, want in zip(graph_module(x), module(x), strict=True):
            assert torch.allclose(got, want, atol=1e-3), (got - want).abs().max()


def _gelu_forms(graph: torch.fx.Graph) -> list[str]:
    return [n.kwargs.get("approximate", "none") for n in graph.nodes if n.target == GELU]


def test_the_gelus_no_epilogue_takes_are_computed_in_the_same_tanh_form() -> None:
    torch.manual_seed(0)
    module = Feedforward().eval()
    graph_module = torch.export.export(module, (torch.randn(2, 3, 8),)).module()
    fuse_gelu_epilogues(graph_module)
    assert _gelu_forms(graph_module.graph) == ["none", "none"]
    assert tanh_gelus(graph_module) == 2
    assert _gelu_forms(graph_module.graph) == ["tanh", "tanh"]
    assert tanh_gelus(graph_module) == 0  # nothing exact left
    x = torch.randn(2, 3, 8)
    with torch.no_grad():  # a sum over 16 tanh GELUs, each at most 4.8e-4 from the exact one
        for got, want in zip(graph_module(x), module(x), strict=True):
            assert torch.allclose(got, want, atol=16 * 4.8e-4), (got - want).abs().max()


def test_an_fp8_feedforward_layer_keeps_its_gemms_and_takes_the_tanh_gelu() -> None:
    """An 8-bit GEMM has no GELU epilogue: its GELU stays a pointwise kernel, in tanh form."""
    torch.manual_seed(0)
    block = nn.Sequential(nn.Linear(32, 64), nn.GELU(), nn.Linear(64, 32)).eval()
    x = torch.randn(4, 32)
    with torch.no_grad():
        want = block(x)
    assert to_fp8(block, {"0": float(x.abs().max()), "2": 8.0}, torch.float32) == ["0", "2"]
    dims = ({0: torch.export.Dim("rows", min=2, max=64)},)
    with torch.no_grad():
        program = torch.export.export(block, (x,), dynamic_shapes=dims, strict=False)
        fused, details = fuse_program(program, (x,), dims, projections=False, gelu=True)
    assert details == {"gelu_epilogues": 0, "tanh_gelus": 1}
    assert _gelu_forms(fused.graph) == ["tanh"]
    assert sum(n.target == torch.ops.aten._scaled_mm.default for n in fused.graph.nodes) == 2
    with torch.no_grad():
        got, exact = fused.module()(x), program.module()(x)
    assert nn.functional.cosine_similarity(got, want).min() > 0.99  # FP8's own error
    assert nn.functional.cosine_similarity(got, exact).min() > 0.9999  # the tanh form's


def test_a_half_precision_transformer_keeps_its_outputs_with_one_call_per_feedforward_layer() -> None:
    torch.manual_seed(0)
    config = transformers.BertConfig(
        hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=128, vocab_size=100
    )
    bert = transformers.BertModel(config).eval().half()

    class Hidden(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.bert = bert

        def forward(self, ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
            return self.bert(input_ids=ids, attention_mask=mask).last_hidden_state.float()

    model = Hidden().eval()
    example = (torch.randint(0, 100, (2, 8)), torch.ones(2, 8, dtype=torch.long))
    batch, seq = torch.export.Dim("batch", min=1, max=8), torch.export.Dim("seq", min=2, max=16)
    dynamic = ({0: batch, 1: seq}, {0: batch, 1: seq})
    with torch.no_grad():
        program = torch.export.export(model, example, dynamic_shapes=dynamic, strict=False)
        fused, details = fuse_program(program, example, dynamic, projections=True, gelu=True)
    assert details == {"fused_projections": 2, "gelu_epilogues": 2, "tanh_gelus": 0}
    assert sum(n.target == ADDMM_GELU for n in fused.graph.nodes) == 2
    ids, mask = torch.randint(0, 100, (3, 12)), torch.ones(3, 12, dtype=torch.long)
    mask[1, 7:] = 0
    with torch.no_grad():
        want, got = model(ids, mask), fused.module()(ids, mask)
    assert torch.allclose(got, want, atol=2e-2, rtol=1e-2), (got - want).abs().max()


def test_nothing_asked_leaves_the_program_and_says_nothing() -> None:
    module = Feedforward().eval()
    example = (torch.randn(2, 3, 8),)
    program = torch.export.export(module, example)
    same, details = fuse_program(program, example, ({},), projections=False, gelu=False)
    assert same is program and details == {}


def test_only_fp16_programs_compiled_for_a_gpu_take_it() -> None:
    tiny = Path(__file__).resolve().parents[2] / "recipes" / "tiny.yaml"
    recipe = load(tiny, []).recipe
    for precision, asked in [("fp16", True), ("fp8", True), ("bf16", False), ("fp32", False)]:
        assert gelu_epilogue_for(recipe, precision) is asked, precision  # fp8's float layers compute in FP16
    off = load(tiny, ["export.pt2.gelu_epilogue=false"]).recipe
    assert not gelu_epilogue_for(off, "fp16")
    assert cuda_epilogue_on(True, "cuda") and not cuda_epilogue_on(False, "cuda")
    # on a CPU it would be a GEMM and an exact GELU, two calls where Inductor fuses the pair itself
    assert not cuda_epilogue_on(True, "cpu")
    if not torch.cuda.is_available():
        assert not cuda_epilogue_on(True, "auto")
