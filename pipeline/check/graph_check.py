"""Every rewritten ONNX graph is checked before anything uses it: fusions, optimizers and quantizers are written
for the models their authors tested, and on another model they can produce a graph that does not load (GPT-2's
fused Gemm of rank 3) or that computes something else. A graph passes when

1. the ONNX checker accepts it (ops ONNX has no schema for, such as ONNX Runtime's own default-domain
   `SimplifiedLayerNormalization`, are left to step 2: the checker cannot judge them);
2. ONNX Runtime loads it on the CPU provider, and for the optimized graphs (which have a safer option to fall
   back to) also on the CUDA provider where a CUDA GPU is present: a graph fused for the CPU can hold kernels
   the CUDA provider refuses (a FusedConv with a Clip activation, from a MobileNet's ReLU6);
3. given the graph it was made from and sample feeds, its outputs are finite and keep the source's direction
   (cosine at least `min_cosine` per output). A loose bound on purpose: it catches a wrong rewrite, not the
   precision a conversion costs, which validation judges against the recipe's tolerances.

A stage that has a safer way to make its graph tries it next (pipeline/stages/optimize_onnx.py)."""

from __future__ import annotations

import copy
from pathlib import Path

import numpy as np
import onnx

from pipeline.check.accuracy import cosine
from pipeline.core import host
from pipeline.toolchain.ort_recurrent import recurrent_in

Feeds = dict[str, np.ndarray]
UNCHECKED_DOMAIN = "ai.onnxruntime.unchecked"  # where nodes the checker has no schema for are moved to


class GraphRejected(Exception):
    """The graph failed a check; the message says which and why, in one line."""


def check_graph(
    model: onnx.ModelProto,
    source: onnx.ModelProto | Path | None = None,
    feeds: Feeds | None = None,
    min_cosine: float = 0.99,
    every_provider: bool = False,
) -> None:
    """Raise GraphRejected unless `model` passes the checks above (3 only when `source` and `feeds` are given;
    the CUDA provider's load only with `every_provider`, for a stage that has a safer graph to fall back to)."""
    try:
        onnx.checker.check_model(_checkable(model))
    except Exception as exc:  # noqa: BLE001 - any checker complaint rejects the graph
        raise GraphRejected(f"ONNX checker: {_first_line(exc)}") from exc
    session = _session(model, "ONNX Runtime could not load it")
    if every_provider and cuda_provider() and not recurrent_in(model):  # never offered that provider
        _session(model, "ONNX Runtime's CUDA provider could not load it", CUDA_PROVIDERS)
    if source is None or feeds is None:
        return
    reference = _session(source, "ONNX Runtime could not load the source graph")
    names = [i.name for i in session.get_inputs()]
    wanted = {k: v for k, v in feeds.items() if k in names}
    try:
        got = session.run(None, wanted)
    except Exception as exc:  # noqa: BLE001
        raise GraphRejected(f"ONNX Runtime could not run it: {_first_line(exc)}") from exc
    expected = reference.run(
        None, {k: v for k, v in feeds.items() if k in [i.name for i in reference.get_inputs()]}
    )
    for output, a, b in zip(session.get_outputs(), got, expected, strict=False):
        a64, b64 = np.asarray(a, np.float64), np.asarray(b, np.float64)
        if a64.shape != b64.shape:
            raise GraphRejected(
                f"output {output.name} has shape {list(a64.shape)}, the source's {list(b64.shape)}"
            )
        if not np.isfinite(a64).all() and np.isfinite(b64).all():
            raise GraphRejected(f"output {output.name} holds NaN/inf where the source's is finite")
        found = cosine(b64, a64)
        if found < min_cosine:
            raise GraphRejected(
                f"output {output.name} departs from the source graph's (cosine {found:.4f} < {min_cosine})"
            )


def _checkable(model: onnx.ModelProto) -> onnx.ModelProto:
    """A copy the checker can judge: default-domain nodes whose op ONNX does not define are moved to a domain
    of their own (the checker skips ops of domains it has no schemas for; ONNX Runtime still loads the real
    graph in step 2)."""
    unknown = [n for n in model.graph.node if n.domain in ("", "ai.onnx") and not onnx.defs.has(n.op_type)]
    if not unknown:
        return model
    model = copy.deepcopy(model)
    for node in model.graph.node:
        if node.domain in ("", "ai.onnx") and not onnx.defs.has(node.op_type):
            node.domain = UNCHECKED_DOMAIN
    model.opset_import.append(onnx.helper.make_opsetid(UNCHECKED_DOMAIN, 1))
    return model


CPU_PROVIDERS = ["CPUExecutionProvider"]
CUDA_PROVIDERS = ["CUDAExecutionProvider", "CPUExecutionProvider"]


def cuda_provider() -> bool:
    """Whether ONNX graphs run on ONNX Runtime's CUDA provider here: the provider is installed and a GPU is."""
    return host.has_ort_provider("CUDAExecutionProvider") and host.has_cuda()


def _session(model: onnx.ModelProto | Path, what: str, providers: list[str] = CPU_PROVIDERS):  # noqa: ANN202
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.log_severity_level = 3
    data = model.SerializeToString() if isinstance(model, onnx.ModelProto) else str(model)
    try:
        return ort.InferenceSession(data, options, providers=providers)
    except Exception as exc:  # noqa: BLE001 - any load failure rejects the graph
        raise GraphRejected(f"{what}: {_first_line(exc)}") from exc


def _first_line(exc: BaseException) -> str:
    text = " ".join(str(exc).split()) or type(exc).__name__
    return text if len(text) <= 300 else text[:299] + "…"
