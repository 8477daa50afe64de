"""The divergence locator on real graphs of the tiny encoder: a sign-flipped weight is found at the node that
consumes it (also after the FP16 conversion), an unchanged graph gives None, and each answer matches an
independent exhaustive scan that marks every comparable tensor at once (affordable on the tiny model only)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import numpy_helper

from pipeline.check import divergence
from pipeline.check.accuracy import LOWER_BOUNDS, METRICS
from pipeline.check.divergence import (
    OUTPUTS_PASS,
    Divergence,
    NotLocated,
    Verdict,
    comparable_tensors,
    judge,
    locate_divergence,
)
from pipeline.recipe import Fp16Export
from pipeline.stages import fp16, optimize_onnx
from pipeline.toolchain import onnx_tools
from tests.unit.stages.onnx_fixtures import tiny_context, tiny_onnx

FLIPPED_MODULE = "layers.1.intermediate"  # layer 1 of 2: the middle of the model


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tiny_onnx(tmp_path_factory).path


@pytest.fixture(scope="module")
def feeds() -> dict[str, np.ndarray]:
    return tiny_context(Path(".")).dataset().feeds_at({"batch": 2, "sequence": 16})


@pytest.fixture(scope="module")
def flipped(tmp_path_factory: pytest.TempPathFactory, reference: Path) -> tuple[Path, onnx.NodeProto]:
    """A copy whose layer-1 FFN up-projection weight has its sign flipped, and the MatMul that consumes it."""
    model = onnx_tools.load(reference)
    (target,) = [
        n
        for n in model.graph.node
        if n.op_type == "MatMul" and (onnx_tools.module_path(n) or "").endswith(FLIPPED_MODULE)
    ]
    weight = next(i for i in model.graph.initializer if i.name == target.input[1])
    assert sum(target.input[1] in n.input for n in model.graph.node) == 1, "the weight must have one consumer"
    weight.CopyFrom(numpy_helper.from_array(-numpy_helper.to_array(weight), weight.name))
    path = tmp_path_factory.mktemp("divergence") / "flipped.onnx"
    onnx_tools.save(model, path)
    return path, target


def _fp16(source: Path, target: Path) -> Path:
    onnx_tools.save(fp16.convert(onnx_tools.load(source), Fp16Export()), target)
    return target


@pytest.fixture(scope="module")
def half(tmp_path_factory: pytest.TempPathFactory, reference: Path) -> Path:
    return _fp16(reference, tmp_path_factory.mktemp("divergence-fp16") / "model.fp16.onnx")


def exhaustive_first(
    reference: Path, candidate: Path, feeds: dict[str, np.ndarray], metric: str, t: float
) -> str:
    """Ground truth by brute force: every comparable tensor marked in one plain ONNX Runtime run per graph,
    the first one past the threshold."""
    import onnxruntime as ort

    ref, cand = onnx_tools.load(reference), onnx_tools.load(candidate)
    names = [name for name, _ in comparable_tensors(ref, cand)]
    values = []
    for model in (ref, cand):
        del model.graph.output[:]
        model.graph.output.extend(onnx.helper.make_empty_tensor_value_info(n) for n in names)
        options = ort.SessionOptions()
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
        session = ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
        wanted = {i.name for i in session.get_inputs()}
        values.append(session.run(names, {k: v for k, v in feeds.items() if k in wanted}))
    for name, r, c in zip(names, *values, strict=True):
        value = METRICS[metric](r, c)
        if (value < t) if metric in LOWER_BOUNDS else (value > t):
            return name
    raise AssertionError("no comparable tensor exceeds the threshold")


def test_sign_flipped_weight_is_found_at_its_consumer(
    reference: Path, flipped: tuple[Path, onnx.NodeProto], feeds: dict[str, np.ndarray]
) -> None:
    path, target = flipped
    found = locate_divergence(reference, path, feeds, "cosine", 0.9999)
    assert isinstance(found, Divergence)
    assert (found.node, found.op_type, found.tensor) == (target.name, "MatMul", target.output[0])
    assert found.module == onnx_tools.module_path(target) and found.module.endswith(FLIPPED_MODULE)
    assert found.value < -0.99  # x @ -W is -(x @ W): every row points the other way
    assert found.exact and found.problem is None
    assert found.tensor == exhaustive_first(reference, path, feeds, "cosine", 0.9999)
    # bisected: a few runs, each marking a few tensors, never the whole list
    assert found.runs <= 1 + found.candidates.bit_length()
    assert found.checked <= found.runs * divergence.MARKS_PER_RUN < found.candidates
    line = found.describe()
    assert line.startswith(f"first diverges at {target.name} (MatMul, {found.module}) output {found.tensor}:")
    assert "cosine -1 < 0.9999" in line


def test_unchanged_graph_and_passing_outputs_give_none(
    reference: Path,
    flipped: tuple[Path, onnx.NodeProto],
    feeds: dict[str, np.ndarray],
    capfd: pytest.CaptureFixture[str],
) -> None:
    assert locate_divergence(reference, reference, feeds, "max_abs", 0.0) == NotLocated(OUTPUTS_PASS)
    passing = locate_divergence(reference, flipped[0], feeds, "max_abs", 1e6)  # final outputs pass
    assert passing == NotLocated(OUTPUTS_PASS)
    out, err = capfd.readouterr()
    assert (out, err) == ("", "")  # Polygraphy and ONNX Runtime kept quiet


def test_fp16_graph_with_a_flipped_weight_is_found_despite_cast_nodes(
    reference: Path, flipped: tuple[Path, onnx.NodeProto], feeds: dict[str, np.ndarray], tmp_path: Path
) -> None:
    path, target = flipped
    half_flipped = _fp16(path, tmp_path / "flipped.fp16.onnx")
    casts = [n for n in onnx_tools.load(half_flipped).graph.node if n.op_type == "Cast"]
    assert len(casts) > sum(n.op_type == "Cast" for n in onnx_tools.load(reference).graph.node)
    found = locate_divergence(reference, half_flipped, feeds, "cosine", 0.999)
    assert isinstance(found, Divergence)
    assert (found.node, found.tensor) == (target.name, target.output[0])
    assert found.module == onnx_tools.module_path(target)  # the converter keeps the exporter's metadata
    assert found.exact


def test_fused_contrib_ops_of_the_optimized_graph(
    reference: Path, flipped: tuple[Path, onnx.NodeProto], feeds: dict[str, np.ndarray], tmp_path: Path
) -> None:
    """ONNX Runtime's transformer optimizer fuses LayerNorms and Gelus into com.microsoft ops (untyped for ONNX
    shape inference); their outputs keep the reference's names and are compared like any other."""
    ctx = tiny_context(tmp_path)
    optimize = ctx.recipe.export.optimize
    model, stats = optimize_onnx.optimize(flipped[0], optimize, ctx.model().config, fp16=None)
    assert stats["transformers"].get("SkipLayerNormalization")
    path = tmp_path / "flipped.optimized.onnx"
    onnx_tools.save(model, path)
    order = comparable_tensors(onnx_tools.load(reference), model)
    assert any(node.domain == "com.microsoft" for _, node in order)
    found = locate_divergence(reference, path, feeds, "cosine", 0.9999)
    assert isinstance(found, Divergence) and found.exact
    assert (found.node, found.tensor) == (flipped[1].name, flipped[1].output[0])


def test_tight_threshold_on_fp16_reports_an_early_node(
    reference: Path, half: Path, feeds: dict[str, np.ndarray]
) -> None:
    found = locate_divergence(reference, half, feeds, "max_abs", 1e-9)
    assert isinstance(found, Divergence) and found.exact and found.problem is None
    assert 1e-9 < found.value < 0.1  # half-precision rounding, not a broken graph
    names = [n for n, _ in comparable_tensors(onnx_tools.load(reference), onnx_tools.load(half))]
    assert names.index(found.tensor) < len(names) // 4
    assert found.tensor == exhaustive_first(reference, half, feeds, "max_abs", 1e-9)


def _scaled_chain(folder: Path, first: float, second: float) -> Path:
    """x -> big = x * first -> out = big * second: the reference with 1000 and 0.001."""
    from onnx import TensorProto, helper

    graph = helper.make_graph(
        [
            helper.make_node("Mul", ["x", "up"], ["big"], name="up_mul"),
            helper.make_node("Mul", ["big", "down"], ["out"], name="down_mul"),
        ],
        "chain",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 8])],
        [helper.make_tensor_value_info("out", TensorProto.FLOAT, [2, 8])],
        [
            numpy_helper.from_array(np.array(first, np.float32), "up"),
            numpy_helper.from_array(np.array(second, np.float32), "down"),
        ],
    )
    path = folder / f"chain-{first}-{second}.onnx"
    onnx_tools.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)
    return path


def test_an_absolute_gate_judges_each_tensor_on_its_own_scale(tmp_path: Path) -> None:
    """A hold-out's INT8 classifier was said to 'first diverge' at its first Gemm by its score's bound of
    0.0013, a number on the score's scale, not on a hidden tensor's. Here the first node's product is 1000 times
    the output and off by a relative 5e-7 (within any gate on its scale); the second node is off by 1e-4, which
    fails the output's tolerance 1e-5. Judged on their own scales, the second node is where it diverges."""
    reference = _scaled_chain(tmp_path, 1000.0, 0.001)
    candidate = _scaled_chain(tmp_path, 1000.0005, 0.0010001)
    feeds = {"x": np.linspace(0.5, 1.0, 16, dtype=np.float32).reshape(2, 8)}
    unscaled = locate_divergence(reference, candidate, feeds, "max_abs", 1e-5)
    assert (
        isinstance(unscaled, Divergence) and unscaled.node == "up_mul"
    )  # 1000 x 5e-7 is past 1e-5 in absolute terms
    found = locate_divergence(reference, candidate, feeds, "max_abs", 1e-5, scaled=True)
    assert isinstance(found, Divergence) and found.node == "down_mul" and found.exact, found
    assert found.threshold == pytest.approx(1e-5)  # out's scale: max(1, largest |value|) is 1
    assert found.value > found.threshold
    assert locate_divergence(reference, candidate, feeds, "max_abs", 1e-3, scaled=True) == NotLocated(
        OUTPUTS_PASS
    )


def test_run_budget_spent_says_at_or_before(
    reference: Path, flipped: tuple[Path, onnx.NodeProto], feeds: dict[str, np.ndarray]
) -> None:
    found = locate_divergence(reference, flipped[0], feeds, "cosine", 0.9999, max_runs=1)
    assert isinstance(found, Divergence) and not found.exact and found.runs == 1
    assert found.tensor in {o.name for o in onnx_tools.load(flipped[0]).graph.output}
    assert "first diverges at or before" in found.describe()
    record = found.to_json()
    assert record["exact"] is False and record["description"] == found.describe()
    assert json.loads(json.dumps(record, allow_nan=False)) == record


def test_weights_in_external_files_are_read_in_place(
    reference: Path,
    flipped: tuple[Path, onnx.NodeProto],
    feeds: dict[str, np.ndarray],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The layout of a graph past protobuf's 2 GB limit: weights in a file of their own. Each run's marked
    graph is kept in memory: nothing is written beside the graph or into the working directory."""
    folder = tmp_path / "external"
    folder.mkdir()
    external = folder / "flipped.onnx"
    onnx.save_model(
        onnx_tools.load(flipped[0]), str(external), save_as_external_data=True, location="weights.bin"
    )
    workdir = tmp_path / "cwd"
    workdir.mkdir()
    monkeypatch.chdir(workdir)
    found = locate_divergence(reference, external, feeds, "cosine", 0.9999)
    assert isinstance(found, Divergence) and found.node == flipped[1].name
    assert sorted(p.name for p in folder.iterdir()) == ["flipped.onnx", "weights.bin"]
    assert list(workdir.iterdir()) == []


def test_numbers_print_on_their_side_of_the_threshold() -> None:
    assert divergence._numbers(0.99999963, 0.9999999) == ("0.9999996", "0.9999999")
    assert divergence._numbers(-0.9999999, 0.9999) == ("-1", "0.9999")
    assert divergence._numbers(0.0021177, 1e-9) == ("0.00212", "1e-09")


def test_judge_rules() -> None:
    a = np.array([[1.0, 2.0, -np.inf], [3.0, 4.0, -np.inf]], np.float32)
    assert not judge(a, a.copy(), "max_abs", 0.0).exceeds  # an equal -inf mask compares as equal
    shifted = a + np.float32(1e-3)
    assert judge(a, shifted, "max_abs", 1e-4).exceeds and not judge(a, shifted, "max_abs", 1e-2).exceeds
    nan = a.copy()
    nan[0, 0] = np.nan
    verdict = judge(a, nan, "cosine", 0.5)
    assert verdict.exceeds and verdict.problem == "1 NaN/inf values differ from the reference"
    verdict = judge(a, a[:, :2], "cosine", 0.5)
    assert verdict.exceeds and verdict.problem == "shape [2, 2] differs from the reference [2, 3]"
    assert judge(a[:, :2], -a[:, :2], "cosine", 0.9).exceeds
    assert not judge(a[:, :2], 2 * a[:, :2], "cosine", 0.9).exceeds  # cosine is a lower bound, scale-free


def test_judge_says_when_float16_cannot_hold_the_values() -> None:
    """A hold-out LeViT's random weights shrank its activations to 1e-10: its FP16 graph diverged at cosine 0,
    which said nothing of why."""
    rng = np.random.default_rng(0)
    tiny = (rng.standard_normal((4, 8)) * 1e-8).astype(np.float32)
    verdict = judge(tiny, tiny.astype(np.float16), "cosine", 0.999)
    assert verdict.exceeds and verdict.problem is not None
    assert verdict.problem.startswith("cosine 0 < 0.999: every reference value here is at most 2.3e-08, ")
    assert "under float16's smallest normal value (6.1e-05)" in verdict.problem
    held = (rng.standard_normal((4, 8)) * 3e-5).astype(np.float32)  # float16 holds these well enough
    verdict = judge(held, -held.astype(np.float16), "cosine", 0.999)  # a sign flip: not the range's fault
    assert verdict.exceeds and verdict.problem is None
    ordinary = rng.standard_normal((4, 8)).astype(np.float32)
    flipped = -ordinary.astype(np.float16)  # diverges for another reason: no underflow said
    verdict = judge(ordinary, flipped, "cosine", 0.999)
    assert verdict.exceeds and verdict.problem is None


def test_judge_accepts_masking_sentinels_but_not_overflow() -> None:
    """An additive mask of finfo(float32).min becomes -65504 or -inf in float16: equal as far as float16 can
    say. A value float16 cannot hold (1e5) becoming inf is a real overflow."""
    low = np.finfo(np.float32).min
    reference = np.array([[low, 1.5, low + 3.0], [2.0, 1e5, 0.25]], np.float32)
    with np.errstate(over="ignore"):
        half = reference.astype(np.float16)  # low -> -inf, 1e5 -> inf
    assert np.isinf(half[0, 0]) and np.isinf(half[1, 1])
    verdict = judge(reference, half, "max_abs", 1e-2)
    assert verdict.exceeds and verdict.problem == "1 NaN/inf values differ from the reference"  # only 1e5
    clipped = np.array([[-65504, 1.5, -65500], [2.0, 3.0, 0.25]], np.float16)
    reference[1, 1] = 3.0
    assert judge(reference, clipped, "max_abs", 1e-2) == Verdict(False, 0.0)
    with np.errstate(over="ignore"):
        verdict = judge(reference, reference.astype(np.float16), "cosine", 0.9999)
    assert not verdict.exceeds and verdict.value == pytest.approx(1.0)


def test_lineage_follows_data_flow(reference: Path) -> None:
    """What the search may blame for each output: the pooled output reads the pooling mask, the per-token
    output does not (so a mask that stays exact cannot clear anything the hidden states depend on)."""
    model = onnx_tools.load(reference)
    order = comparable_tensors(model, model)
    names = [n for n, _ in order]
    lineage = dict(zip(names, divergence._lineage(divergence._sorted_nodes(model), names), strict=True))

    def depends(output: str, tensor: str) -> bool:
        return bool(lineage[output] >> names.index(tensor) & 1)

    casts = [t for t, node in order if node.op_type == "Cast"]  # attention mask to float: bias and pooling
    assert len(casts) == 2 and all(depends("pooled", c) for c in casts)
    assert sorted(depends("hidden", c) for c in casts) == [False, True]
    assert all(depends("hidden", t) for t, node in order if node.op_type == "MatMul")
    assert depends("hidden", "hidden") and not depends("hidden", "pooled")
