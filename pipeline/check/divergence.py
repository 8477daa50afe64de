"""Where a derived ONNX graph first departs from the FP32 graph it came from: the first node output, in the
candidate's topological order, whose error against the same-named tensor of the reference exceeds the
tolerance. A failing artifact's report then names a node and its PyTorch module, not only a final output.

Both graphs run through Polygraphy's ONNX Runtime runner with a few tensors marked as outputs per run (never the
whole model: a MiniLM-sized graph marked everywhere holds every activation at once). The search is a bisection
over the comparable tensors in topological order that follows the graph's data flow: the suspects are the
tensors the failing outputs depend on; a tensor past the tolerance narrows them to what it depends on, and a
tensor within tolerance clears what it depends on (the error is assumed to grow along every path). Plain
positional bisection is misled by side branches that stay exact (mask casts in FP16, a pooling mask that only
the pooled output reads): on MiniLM FP16 it reported a Softmax where the embedding Gather is the first
tensor that differs. The tensor reported always exceeds the tolerance; when `exact`, every comparable tensor it
depends on was checked within tolerance or cleared by a checked tensor that depends on it.

ONNX Runtime's graph optimizations are off for these runs: a marked output blocks the fusions it would cut
through, so with them on a tensor's value would depend on which other tensors a run marked, and successive
runs would not measure the same graph. The locator therefore reads the graph as written; a failure that
exists only after ONNX Runtime's fusions returns None here."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import onnx

from pipeline.check.accuracy import LOWER_BOUNDS, METRICS, output_scale
from pipeline.toolchain import onnx_tools

MARKS_PER_RUN = 8  # tensors marked per search run: each cuts the open suspects into MARKS_PER_RUN + 1 parts
_SKIPPED_OPS = {"Constant"}  # a constant's consumer is where its error shows


@dataclass(frozen=True)
class Divergence:
    """The first tensor found past the tolerance, with the node that produces it and how it was found."""

    tensor: str
    node: str
    op_type: str
    module: str | None  # PyTorch module path from the exporter's metadata, when known
    metric: str
    value: float  # nan when `problem` says why there is no value
    threshold: float
    checked: int  # tensors compared
    candidates: int  # comparable tensors in the candidate graph
    runs: int  # inference runs made (each runs both graphs)
    exact: bool = True  # False: max_runs ran out before all it depends on was cleared ("at or before")
    problem: str | None = None  # shape mismatch or NaN/inf values (no metric value), or float16's range

    def describe(self) -> str:
        """One line for the report."""
        where = f"{self.op_type}, {self.module}" if self.module else self.op_type
        if self.problem is not None:
            what = self.problem
        else:
            op = "<" if self.metric in LOWER_BOUNDS else ">"
            value, threshold = _numbers(self.value, self.threshold)
            what = f"{self.metric} {value} {op} {threshold}"
        at = "at" if self.exact else "at or before"
        return f"first diverges {at} {self.node} ({where}) output {self.tensor}: {what}"

    def to_json(self) -> dict[str, Any]:
        """Every field (value None when it is NaN: strict JSON has no NaN) plus the report line."""
        out = dataclasses.asdict(self)
        out["value"] = None if math.isnan(self.value) else self.value
        return out | {"description": self.describe()}


def _numbers(value: float, threshold: float) -> tuple[str, str]:
    """The threshold as written; the value with just enough digits to print on its own side of the threshold
    (0.9999996 against 0.9999999 must not print as 1)."""
    written = f"{threshold:.10g}"
    for digits in range(3, 17):
        shown = f"{value:.{digits}g}"
        if np.sign(float(shown) - threshold) == np.sign(value - threshold):
            return shown, written
    return repr(value), written


OUTPUTS_PASS = "outputs_pass"  # the failing outputs pass when the graphs run as written (optimizations off)
NO_SHARED_TENSOR = "no_shared_tensor"  # every node of the candidate renamed or fused away


@dataclass(frozen=True)
class NotLocated:
    """Why no tensor was named (OUTPUTS_PASS or NO_SHARED_TENSOR): the report must tell a graph whose failure
    the locator cannot see (it appears only with ONNX Runtime's optimizations, or on another provider) from
    one it could not search."""

    why: str


@dataclass(frozen=True)
class Verdict:
    """One tensor's comparison: past the tolerance or not, the metric's value, or why there is none."""

    exceeds: bool
    value: float
    problem: str | None = None


def locate_divergence(
    reference: Path,
    candidate: Path,
    feeds: dict[str, np.ndarray],
    metric: str,
    threshold: float,
    max_runs: int = 32,
    scaled: bool = False,
) -> Divergence | NotLocated:
    """The first comparable tensor of `candidate`, among those its failing outputs depend on, whose `metric`
    against `reference` fails `threshold` (max_abs, mean_abs, max_rel: value <= threshold passes; cosine:
    value >= threshold passes). `scaled`: the threshold is a tolerance times each tensor's own scale
    (output_scale of its reference values), as an absolute gate is applied to an output: a tensor ten times
    larger than the output is allowed ten times its error. NotLocated when the final outputs pass, or when
    the graphs share no comparable tensor. At most `max_runs` runs, each of both graphs. Raises what ONNX
    Runtime raises."""
    if metric not in METRICS:
        raise ValueError(f"unknown metric {metric!r}; one of {', '.join(METRICS)}")
    if max_runs < 1:
        raise ValueError(f"max_runs must be at least 1 (got {max_runs})")
    ref_graph, cand_graph = _Graph(reference), _Graph(candidate)
    order = comparable_tensors(ref_graph.model, cand_graph.model)
    if not order:
        return NotLocated(NO_SHARED_TENSOR)
    names = [name for name, _ in order]
    graph_outputs = [o.name for o in cand_graph.model.graph.output]
    nodes = _sorted_nodes(cand_graph.model)
    lineage = _lineage(nodes, names)
    finals = _finals(nodes, names, lineage, graph_outputs) or [len(names) - 1]
    verdicts: dict[int, Verdict] = {}
    thresholds: dict[int, float] = {}
    runs = 0

    def compare(indices: Sequence[int]) -> None:
        nonlocal runs
        runs += 1
        marked = [names[i] for i in indices]
        ref_out, cand_out = ref_graph.run(marked, feeds), cand_graph.run(marked, feeds)
        for i in indices:
            ref = ref_out[names[i]]
            thresholds[i] = threshold * output_scale(ref) if scaled else threshold
            verdicts[i] = judge(ref, cand_out[names[i]], metric, thresholds[i])

    compare(finals)
    failing = [i for i in finals if verdicts[i].exceeds]
    if not failing:
        return NotLocated(OUTPUTS_PASS)
    # The first tensor past the tolerance lies among what the failing outputs depend on (the suspects); the
    # earliest exceeding tensor seen (`first`) narrows them to its own lineage, and a tensor within tolerance
    # clears its lineage (the error is assumed to grow along every path).
    first = min(failing)
    suspects = 0
    for i in failing:
        suspects |= lineage[i]
    while runs < max_runs and (open_ := _unresolved(suspects, first, verdicts)):
        probes = _spread(open_, MARKS_PER_RUN)
        compare(probes)
        for i in probes:
            if verdicts[i].exceeds:
                first, suspects = i, suspects & lineage[i]
                break
            suspects &= ~lineage[i]

    tensor, node = order[first]
    verdict = verdicts[first]
    return Divergence(
        tensor=tensor,
        node=node.name,
        op_type=node.op_type if node.domain in ("", "ai.onnx") else f"{node.domain}.{node.op_type}",
        module=onnx_tools.module_path(node),
        metric=metric,
        value=verdict.value,
        threshold=thresholds[first],
        checked=len(verdicts),
        candidates=len(order),
        runs=runs,
        exact=not _unresolved(suspects, first, verdicts),
        problem=verdict.problem,
    )


def comparable_tensors(
    reference: onnx.ModelProto, candidate: onnx.ModelProto
) -> list[tuple[str, onnx.NodeProto]]:
    """(tensor, producing node) for every float node output of `candidate`, in topological order, that the
    reference also computes under the same name. Inserted Cast nodes and fused ops produce new names and so
    drop out; outputs whose type is unknown (contrib ops) stay in and are compared as run."""
    produced_by_reference = {o for n in reference.graph.node for o in n.output if o}
    types = _known_types(candidate)
    order = []
    for node in _sorted_nodes(candidate):
        if node.op_type in _SKIPPED_OPS:
            continue
        for name in node.output:
            if name and name in produced_by_reference and types.get(name, "?") != "not float":
                order.append((name, node))
    return order


def _sorted_nodes(model: onnx.ModelProto) -> list[onnx.NodeProto]:
    """The main graph's nodes in topological order (converters may append nodes at the end)."""
    graph = onnx.GraphProto()  # the nodes only: sorting needs no weights
    graph.node.extend(model.graph.node)
    onnx_tools.topological_sort(graph)
    return list(graph.node)


def _known_types(model: onnx.ModelProto) -> dict[str, str]:
    """'float' or 'not float' for every value ONNX shape inference can type; contrib ops stay untyped."""
    try:
        inferred = onnx.shape_inference.infer_shapes(model)
    except Exception:  # noqa: BLE001 - without inference every output stays a candidate
        inferred = model
    types = {}
    for value in [*inferred.graph.value_info, *inferred.graph.output]:
        elem = value.type.tensor_type.elem_type if value.type.HasField("tensor_type") else 0
        if elem:
            types[value.name] = "float" if elem in onnx_tools.FLOAT_TYPES else "not float"
    return types


def judge(reference: np.ndarray, actual: np.ndarray, metric: str, threshold: float) -> Verdict:
    """One tensor against its threshold, both as float64. A shape mismatch, or a NaN/inf the reference does
    not share, diverges. Masking sentinels compare as equal: where the reference sits at the edge of its float
    range (an additive mask of finfo(float32).min, or -inf) and the candidate near the edge of its own (-65504
    or -inf in float16) with the same sign, the candidate says all its type can say; a real overflow (1e5 in
    float16) still diverges, at the node that overflows."""
    ref, act = np.asarray(reference, np.float64), np.asarray(actual, np.float64)
    if ref.shape != act.shape:
        return Verdict(
            True, math.nan, f"shape {list(act.shape)} differs from the reference {list(ref.shape)}"
        )
    same = _at_range_edges(np.asarray(reference).dtype, ref, np.asarray(actual).dtype, act)
    same |= np.isnan(ref) & np.isnan(act)
    if same.any():
        ref, act = np.where(same, 0.0, ref), np.where(same, 0.0, act)
    nonfinite = int(np.count_nonzero(~(np.isfinite(ref) & np.isfinite(act))))
    if nonfinite:
        return Verdict(True, math.nan, f"{nonfinite} NaN/inf values differ from the reference")
    value = METRICS[metric](ref, act)
    exceeds = _exceeds(metric, value, threshold)
    if exceeds and np.asarray(actual).dtype == np.float16:
        return Verdict(True, value, _underflow(ref, metric, value, threshold))
    return Verdict(exceeds or not math.isfinite(value), value)


def _exceeds(metric: str, value: float, threshold: float) -> bool:
    """Past the threshold: under a lower bound (cosine), over an upper one; a NaN is past neither."""
    return value < threshold if metric in LOWER_BOUNDS else value > threshold


FP16_TINY = float(np.finfo(np.float16).tiny)  # float16's smallest normal value, 6.1e-05


def _underflow(reference: np.ndarray, metric: str, value: float, threshold: float) -> str | None:
    """Why a float16 tensor diverges where every reference value is under float16's normal range (random
    weights that shrink activations layer by layer, seen in a hold-out LeViT: logits of 1e-10), said only
    where the reference itself, stored in float16, fails the threshold: there the range is the cause, which
    the metric alone does not say."""
    largest = float(np.abs(reference).max()) if reference.size else 0.0
    if not 0.0 < largest < FP16_TINY:
        return None
    with np.errstate(all="ignore"):
        stored = METRICS[metric](reference, reference.astype(np.float16).astype(np.float64))
    if not _exceeds(metric, stored, threshold):
        return None  # float16 can hold these values well enough: the cause is elsewhere
    op = "<" if metric in LOWER_BOUNDS else ">"
    shown, written = _numbers(value, threshold)
    return (
        f"{metric} {shown} {op} {written}: every reference value here is at most {largest:.2g}, under float16's "
        f"smallest normal value ({FP16_TINY:.2g}), where it keeps few significant bits or none (the reference "
        f"itself stored in float16 has {metric} {stored:.3g})"
    )


def _at_range_edges(ref_type: np.dtype, ref: np.ndarray, act_type: np.dtype, act: np.ndarray) -> np.ndarray:
    """Where reference and candidate are each at least half their own type's largest value (or infinite),
    with the same sign: a sentinel plus an ordinary value (mask + attention score) stays near the edge."""
    if not (np.issubdtype(ref_type, np.floating) and np.issubdtype(act_type, np.floating)):
        return np.zeros(ref.shape, bool)
    with np.errstate(invalid="ignore"):
        return (
            (np.abs(ref) >= float(np.finfo(ref_type).max) / 2)
            & (np.abs(act) >= float(np.finfo(act_type).max) / 2)
            & (np.sign(ref) == np.sign(act))
        )


def _unresolved(suspects: int, first: int, verdicts: dict[int, Verdict]) -> list[int]:
    """Suspects before the earliest exceeding tensor that no run has checked yet."""
    return [i for i in _members(suspects) if i < first and i not in verdicts]


def _spread(indices: list[int], count: int) -> list[int]:
    """Up to `count` of the sorted `indices`, evenly spaced, cutting them into count + 1 parts."""
    if len(indices) <= count:
        return indices
    return sorted({indices[len(indices) * k // (count + 1)] for k in range(1, count + 1)})


def _reach(nodes: Sequence[onnx.NodeProto], names: list[str]) -> dict[str, int]:
    """For every node output, a bit set of itself (when comparable) and every comparable tensor it depends on
    (through any tensor, comparable or not); bit i stands for names[i]."""
    index = {name: i for i, name in enumerate(names)}
    reach: dict[str, int] = {}
    for node in nodes:
        upstream = 0
        for name in node.input:
            upstream |= reach.get(name, 0)
        for name in node.output:
            reach[name] = upstream | (1 << index[name] if name in index else 0)
    return reach


def _lineage(nodes: Sequence[onnx.NodeProto], names: list[str]) -> list[int]:
    """For each comparable tensor, a bit set of itself and every comparable tensor it depends on."""
    reach = _reach(nodes, names)
    return [reach[name] for name in names]


def _finals(
    nodes: Sequence[onnx.NodeProto], names: list[str], lineage: list[int], graph_outputs: list[str]
) -> list[int]:
    """Where the search starts: the comparable graph outputs, and for a graph output that is not comparable
    (an integer label from an ArgMax, a flag) the last comparable tensors it depends on (the logits): a
    failing label must be traced through what it is computed from, not through the graph's other outputs."""
    index = {name: i for i, name in enumerate(names)}
    reach = _reach(nodes, names)
    finals = set()
    for output in graph_outputs:
        if output in index:
            finals.add(index[output])
            continue
        members = _members(reach.get(output, 0))
        covered = 0  # what the other members depend on: a member no other depends on is a last one
        for i in members:
            covered |= lineage[i] & ~(1 << i)
        finals.update(i for i in members if not covered >> i & 1)
    return sorted(finals)


def _members(bits: int) -> list[int]:
    """The positions of the set bits, ascending."""
    out = []
    while bits:
        low = bits & -bits
        out.append(low.bit_length() - 1)
        bits ^= low
    return out


class _Graph:
    """One ONNX file, loaded once; each run marks the given tensors as the only outputs (Polygraphy's
    ModifyOutputs, in place and undone after the run: a copy per run would duplicate every weight) and runs
    them with Polygraphy's ONNX Runtime runner on the CPU.

    A graph with external data (every graph past protobuf's 2 GB limit has it) stays without its weights in
    memory: ONNX Runtime reads them from the original files, and nothing is written anywhere."""

    def __init__(self, path: Path):
        self.path = Path(path).resolve()
        self.model = onnx.load(str(self.path), load_external_data=False)
        self.external = onnx_tools.has_external_data(self.model)

    def run(self, outputs: list[str], feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        from polygraphy.backend.onnx import ModifyOutputs
        from polygraphy.backend.onnxrt import OnnxrtRunner
        from polygraphy.logger import G_LOGGER

        wanted = set(onnx_tools.graph_inputs(self.model))
        original = list(self.model.graph.output)
        try:
            with G_LOGGER.verbosity(G_LOGGER.ERROR):
                marked = ModifyOutputs(self.model, outputs=outputs, copy=False)()
                with OnnxrtRunner(self._session(marked.SerializeToString())) as runner:
                    results = runner.infer({k: v for k, v in feeds.items() if k in wanted})
                    return {name: np.array(results[name]) for name in outputs}
        finally:
            del self.model.graph.output[:]
            self.model.graph.output.extend(original)

    def _session(self, model: bytes) -> Any:
        """Polygraphy's session loader, graph optimizations off; a graph with weight files gets a session of
        its own making, since only session options can tell ONNX Runtime where bytes' weights live."""
        import onnxruntime as ort
        from polygraphy.backend.onnxrt import SessionFromOnnx

        level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
        if not self.external:
            return SessionFromOnnx(model, providers=["cpu"], graph_optimization_level=level)
        options = ort.SessionOptions()
        options.graph_optimization_level = level
        options.log_severity_level = 3
        options.add_session_config_entry(
            "session.model_external_initializers_file_folder_path", str(self.path.parent)
        )
        return ort.InferenceSession(model, options, providers=["CPUExecutionProvider"])
