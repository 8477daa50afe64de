"""How outputs of each kind are gated, on real ONNX exports of tests/models/tiny.py ScoreLabel run by ONNX
Runtime: a sigmoid score [batch, 1] and a shape-derived count are one value per sample (per-sample cosine is 1
for any two positive numbers, and INT8's max_abs of 1 x max(1, |ref|) cannot fail a probability), the argmax
label is integer (exact; its cosine says nothing), and `validate` prints the gates the deploy applies."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
import torch
from onnx import helper, numpy_helper

from pipeline.check.accuracy import DIRECTIONLESS, EXACT, SPREAD, ArtifactAccuracy, Check, evaluate
from pipeline.check.divergence import Divergence, NotLocated, locate_divergence
from pipeline.recipe import Tolerance
from pipeline.recipe.measure import DEFAULT_TOLERANCES
from pipeline.stages.validate import divergence_gate
from tests.models.tiny import score_label

ROOT = Path(__file__).resolve().parents[2]
RECIPE = ROOT / "tests" / "recipes" / "score_label.yaml"
OUTPUTS = ["embedding", "score", "count", "label"]
INT8 = Tolerance(**DEFAULT_TOLERANCES["int8"])


def _tolerance(precision: str) -> Tolerance:
    return Tolerance(**DEFAULT_TOLERANCES[precision])


@pytest.fixture(scope="module")
def graphs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The FP32 export, ONNX Runtime's dynamic INT8 quantization of it, and two broken copies: one answering
    1 - score and half the count (every ranking inverted), one with the head's classes 0 and 1 exchanged."""
    from onnxruntime.quantization import QuantType, quantize_dynamic

    folder = tmp_path_factory.mktemp("kinds")
    torch.manual_seed(0)
    module = score_label().eval()
    paths = {name: folder / f"{name}.onnx" for name in ("fp32", "int8", "inverted", "swapped")}
    torch.onnx.export(
        module,
        (torch.randn(2, 16),),
        str(paths["fp32"]),
        dynamo=False,
        input_names=["x"],
        output_names=OUTPUTS,
        dynamic_axes={"x": {0: "batch"}, **{o: {0: "batch"} for o in OUTPUTS}},
        opset_version=18,
    )
    # unsigned weights, as int8_dynamic quantizes: a CPU without VNNI (AVX2 only) saturates the signed-weight
    # GEMM's int16 sums (embedding cosine 0.974 against 0.99996 here on an AMD EPYC with AVX2)
    quantize_dynamic(str(paths["fp32"]), str(paths["int8"]), weight_type=QuantType.QUInt8)

    model = onnx.load(str(paths["fp32"]))
    for node in model.graph.node:
        node.output[:] = [f"{o}_raw" if o in ("score", "count") else o for o in node.output]
    model.graph.initializer.extend(
        [
            numpy_helper.from_array(np.array(1.0, np.float32), "one"),
            numpy_helper.from_array(np.array(0.5, np.float32), "half"),
        ]
    )
    model.graph.node.extend(
        [
            helper.make_node("Sub", ["one", "score_raw"], ["score"]),
            helper.make_node("Mul", ["count_raw", "half"], ["count"]),
        ]
    )
    onnx.save(model, str(paths["inverted"]))

    model = onnx.load(str(paths["fp32"]))
    for init in model.graph.initializer:
        if init.name.startswith("head."):
            value = numpy_helper.to_array(init).copy()
            value[[0, 1]] = value[[1, 0]]
            init.CopyFrom(numpy_helper.from_array(value, init.name))
    onnx.save(model, str(paths["swapped"]))
    return paths | {"module": module}  # type: ignore[dict-item]


FEEDS = {  # held-out data in batches of 8, and shape corners of 2 and 1 samples
    "data": [np.random.default_rng(i).normal(size=(8, 16)).astype(np.float32) for i in range(4)],
    "opt": [np.random.default_rng(10).normal(size=(2, 16)).astype(np.float32)],
    "max": [np.random.default_rng(11).normal(size=(1, 16)).astype(np.float32)],
}


def _reference(module: torch.nn.Module) -> dict[str, list[dict[str, np.ndarray]]]:
    with torch.no_grad():
        return {
            k: [dict(zip(OUTPUTS, (t.numpy() for t in module(torch.from_numpy(x))), strict=True)) for x in xs]
            for k, xs in FEEDS.items()
        }


def _run(path: Path) -> dict[str, list[dict[str, np.ndarray]]]:
    import onnxruntime as ort

    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    return {
        k: [dict(zip(OUTPUTS, session.run(OUTPUTS, {"x": x}), strict=True)) for x in xs]
        for k, xs in FEEDS.items()
    }


def _judge(graphs: dict, name: str, precision: str = "int8") -> ArtifactAccuracy:
    accuracy = ArtifactAccuracy(name, precision, "onnxruntime-cpu")
    return evaluate(
        accuracy, _reference(graphs["module"]), _run(graphs[name]), OUTPUTS, _tolerance(precision)
    )


def test_an_inverted_score_fails_int8_where_per_sample_cosine_and_max_abs_1_passed_it(graphs) -> None:
    """1 - score on every sample: per-sample cosine 1, max_abs well under INT8's 1.0. The spread bound fails it
    at every input set, the corners of one and two samples included (it is the held-out data's spread)."""
    broken = _judge(graphs, "inverted")
    assert not broken
    failing = {(c.output, c.inputs) for c in broken.failures()}
    assert failing == {(o, i) for o in ("score", "count") for i in FEEDS}, broken.reason
    score = [c for c in broken.checks if c.output == "score" and c.inputs == "data"]
    by_metric = {c.metric: c for c in score}
    assert by_metric["cosine"].value == pytest.approx(1.0) and by_metric["cosine"].informational
    bound = by_metric["max_abs"]
    assert bound.reason == SPREAD and not bound.informational and bound.value < 1.0
    assert bound.threshold == pytest.approx(0.2030 * bound.scale, rel=1e-3) and bound.threshold < bound.value
    # the tensors a score is computed from are vectors: the locator judges them by the precision's cosine, not
    # by a bound on the score's spread (a hold-out's INT8 was 'located' at its first Gemm by such a bound)
    assert divergence_gate(bound, INT8) == ("cosine", 0.98, False)
    # an embedding's absolute gate: its tolerance, applied on each tensor's own scale
    embedding = Check("embedding", "data", "max_abs", 0.5, 1e-3 * 4.0, False, False, None, scale=4.0)
    assert divergence_gate(embedding, _tolerance("fp32")) == ("max_abs", pytest.approx(1e-3), True)
    # the same spread (the held-out data's) bounds the corner of one sample
    (at_max,) = [c for c in broken.checks if (c.output, c.inputs, c.metric) == ("score", "max", "max_abs")]
    assert at_max.threshold == bound.threshold
    assert broken.checks and all(not c.blocking for c in broken.checks if c.output in ("embedding", "label"))


def test_real_int8_and_fp32_graphs_pass_their_gates(graphs) -> None:
    """The bound can be met: ONNX Runtime's dynamic INT8 keeps the score and the count within it, and the
    FP32 export passes every FP32 gate. An embedding keeps the gates it had (cosine; max_abs informs)."""
    int8 = _judge(graphs, "int8")
    assert not [c for c in int8.failures() if c.output in ("score", "count")], int8.reason
    spread = [c for c in int8.checks if c.output == "score" and c.metric == "max_abs"]
    assert spread and all(c.reason == SPREAD and c.value <= c.threshold for c in spread)
    emb = {c.metric: c.informational for c in int8.checks if c.output == "embedding" and c.inputs == "data"}
    assert emb["cosine"] is False and emb["max_abs"] is True
    assert _judge(graphs, "fp32", "fp32"), _judge(graphs, "fp32", "fp32").reason


def test_a_label_is_gated_exactly_and_its_divergence_is_judged_by_cosine(graphs) -> None:
    """Classes 0 and 1 exchanged in the head: label fails on max_abs 0 alone (its cosine only informs: 0 vs
    4 is cosine 0, 3 vs 4 cosine 1). The divergence locator follows the label back to the logits it is the
    argmax of and judges them by the precision's cosine: not by the label's 0, which every INT8 node exceeds."""
    swapped = _judge(graphs, "swapped")
    assert not swapped
    assert {(c.output, c.metric) for c in swapped.failures()} == {("label", "max_abs")}, swapped.reason
    label = [c for c in swapped.checks if c.output == "label"]
    assert all(c.informational for c in label if c.metric == "cosine")
    assert all(c.threshold == 0 and c.reason == EXACT for c in label if c.metric == "max_abs")

    metric, threshold, scaled = divergence_gate(swapped.failures()[0], INT8)
    assert (metric, threshold, scaled) == ("cosine", 0.98, False)
    feeds = {"x": FEEDS["data"][0]}
    found = locate_divergence(graphs["fp32"], graphs["swapped"], feeds, metric, threshold)
    assert isinstance(found, Divergence) and found.op_type == "Gemm" and found.metric == "cosine", found
    assert found.value < 0.98 and "head" in (found.module or found.node + found.tensor)
    # real INT8: whatever the locator names, it is past the float gate, never 'max_abs 0.0183 > 0'
    real = locate_divergence(graphs["fp32"], graphs["int8"], feeds, metric, threshold)
    assert isinstance(real, NotLocated) or (real.metric == "cosine" and real.value < threshold)


def test_validate_prints_the_gates_the_deploy_applies(graphs) -> None:
    """`validate` runs the model in pre-flight, so it knows each output's kind: its table is gates_for's, the
    same rule checks_for applies. Every (precision, output) row's gating metrics are those that can fail a
    real artifact there."""
    proc = subprocess.run(
        [sys.executable, "-m", "pipeline", "validate", str(RECIPE), "--json"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr
    rows = {(r["precision"], r["output"]): r for r in json.loads(proc.stdout)["gates"]}
    assert (
        rows[("int8", "label")]["gates"] == {"max_abs": 0.0} and rows[("int8", "label")]["kind"] == "integer"
    )
    assert "cosine" in rows[("int8", "label")]["informational"]
    assert rows[("int8", "score")]["text"] == "max_abs ≤ 0.203 × spread"
    assert rows[("fp16", "count")]["bases"]["max_abs"] == "spread"
    assert rows[("int8", "embedding")]["gates"] == {"cosine": 0.98}
    assert "label (integer)" in proc.stderr and "max_abs = 0 (exact)" in proc.stderr
    reference, actual = _reference(graphs["module"]), _run(graphs["fp32"])
    for precision in ("fp32", "fp16", "int8"):
        applied = evaluate(
            ArtifactAccuracy("a", precision, "x"), reference, actual, OUTPUTS, _tolerance(precision)
        )
        for output in OUTPUTS:
            gating = {c.metric for c in applied.checks if c.output == output and not c.informational}
            assert gating - {"finite"} == set(rows[(precision, output)]["gates"]), (precision, output)


def test_the_sign_off_names_each_gate_used(graphs) -> None:
    """FP32 gates a score by its own max_abs, INT8 by the spread bound: the accuracy section says both, with
    the spread, whichever artifact's checks come last (the paragraph once named only the last one's rule)."""
    from pipeline.check.results import artifact_entry
    from pipeline.report.document import _accuracy

    entries = {
        name: artifact_entry([_judge(graphs, name, precision)])
        for name, precision in (("int8", "int8"), ("fp32", "fp32"))
    }
    text = repr(_accuracy({"artifacts": entries, "reference": "torch-fp32"}, None))
    assert "sqrt(1/cosine² - 1) × the output's spread" in text and "score " in text
    assert "as the tolerance sets it where it gates max_abs" in text
    assert "label: integer values" in text and "cosine (meaningless for class ids) only informs" in text


def test_a_failure_the_locator_cannot_see_is_said_as_such(monkeypatch: pytest.MonkeyPatch) -> None:
    """A hold-out ConvNeXt's INT8 graph failed (cosine 0.979) only with ONNX Runtime's optimizations on; the
    locator runs the graph as written and found every output within the gate, and the report said 'no ONNX
    node output exceeds the tolerance', which read as if the graph passed."""
    from pipeline.check.divergence import NO_SHARED_TENSOR, OUTPUTS_PASS
    from pipeline.core import host
    from pipeline.stages.validate import _not_located

    passes = NotLocated(OUTPUTS_PASS)
    logits = Check("logits", "data", "cosine", 0.979, 0.98, False, False)
    note = _not_located(passes, logits, "cosine", 0.98, "onnxruntime-cpu")
    assert note.startswith(
        "logits passes when the graph runs as written on the first batch at data on ONNX Runtime's CPU provider"
    )
    assert note.endswith("another batch, or the runtime it failed on (onnxruntime-cpu)")
    assert "not searched" in _not_located(NotLocated(NO_SHARED_TENSOR), logits, "cosine", 0.98, "x")
    label = Check("label", "data", "max_abs", 1, 0, False, False, EXACT)
    assert "nearly ties" in _not_located(passes, label, "cosine", 0.98, "x")
    spread = Check("score", "data", "max_abs", 0.2, 0.1, False, False, SPREAD)
    assert "how little it varies" in _not_located(passes, spread, "cosine", 0.98, "x")
    written = Check("score", "data", "max_abs", 0.2, 0.1, False, False, DIRECTIONLESS)
    assert "own bound is tighter" in _not_located(passes, written, "cosine", 0.98, "x")
    # an x86 CPU without VNNI (this CI's AMD EPYC): the static INT8 graph's signed weights can saturate ONNX
    # Runtime's fused 8-bit GEMMs; the dynamic graph's weights are unsigned
    for without_vnni in (True, False):
        monkeypatch.setattr(host, "x86_without_vnni", lambda v=without_vnni: v)
        static = _not_located(passes, logits, "cosine", 0.98, "onnxruntime-cpu", "onnx-int8")
        assert ("AVX2 but no VNNI" in static) is without_vnni
        assert "VNNI" not in _not_located(
            passes, logits, "cosine", 0.98, "onnxruntime-cpu", "onnx-int8-dynamic"
        )
        assert "VNNI" not in _not_located(passes, logits, "cosine", 0.98, "onnxruntime-cuda", "onnx-int8")
