"""The sign-off's first screen: one card that decides. The verdict in three states (signed off, provisional:
signed off but the winner's speed did not settle, not signed off), the file to ship and how to load it, its
figure with the interval, and how much was checked: validated, not run here, failed. A release manager reads
this and nothing else; every line of it is backed by the sections below."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pipeline.check.speed import figure_text
from pipeline.check.verdicts import records
from pipeline.core.variants import parse
from pipeline.report.blocks import Card
from pipeline.report.facts import not_run

Dict = Mapping[str, Any]
STATES = {
    "signed_off": "SIGNED OFF",
    "provisional": "PROVISIONAL: signed off, but the winner's speed did not settle (measure again)",
    "not_signed_off": "NOT SIGNED OFF: nothing may be deployed from this version",
}


def decision_card(header: Dict, accuracy: Dict | None, speed: Dict | None, winner: Dict | None) -> Card:
    state = _state(header)
    facts: list[tuple[str, str]] = []
    if winner:
        graph = ", CUDA graph" if winner.get("cuda_graph") else ""
        facts += [
            ("ship", f"{winner.get('file') or '—'} ({winner.get('artifact')})"),
            ("run it on", f"{winner.get('runtime')} ({winner.get('io')} I/O{graph})"),
            (_figure_label(winner), _figure(winner)),
        ]
    else:
        facts.append(("ship", "nothing: no artifact was selected"))
    facts += _counts(header, accuracy, speed)
    return Card(
        state, STATES[state], facts, load_snippet(header, winner, _inputs(winner, speed)) if winner else None
    )


def _inputs(winner: Dict, speed: Dict | None) -> list[str]:
    """The model's input names: the winner's timed shapes, else any timed row's (a served-rate winner has
    none of its own)."""
    shapes = winner.get("shapes") or next(
        (r.get("shapes") for r in (speed or {}).get("results") or [] if r.get("shapes")), {}
    )
    return list(shapes or {})


def _state(header: Dict) -> str:
    if not header.get("signed_off"):
        return "not_signed_off"
    return "provisional" if header.get("provisional") else "signed_off"


def _figure_label(winner: Dict) -> str:
    objective = winner.get("objective") or {}
    metric = str(objective.get("metric") or "p50_ms").removesuffix("_ms")
    batch = objective.get("batch")
    return f"{metric} at batch {batch}" if batch else metric


def _figure(winner: Dict) -> str:
    unit = winner.get("unit")
    span = winner.get("interval") or []
    text = figure_text(winner.get("value"), unit)
    if len(span) == 2 and all(isinstance(v, int | float) for v in span):
        text += f" (95% interval {figure_text(span[0], unit)} to {figure_text(span[1], unit)})"
    return text


def _counts(header: Dict, accuracy: Dict | None, speed: Dict | None) -> list[tuple[str, str]]:
    """Pairs of artifact and runtime validated (passed of judged), artifacts not runnable here, and variants
    that failed to build, validate or time."""
    verdicts = [
        v.passed for entry in records(accuracy).values() for v in (entry.runtimes.values() or [entry])
    ]
    passed = sum(1 for v in verdicts if v)
    unrun = sorted({artifact for artifact, _, _ in not_run(accuracy, speed)})
    failed = list(dict.fromkeys(str(f.get("artifact")) for f in header.get("failed") or []))
    return [
        ("validated", f"{passed} of {len(verdicts)} artifact-runtime pairs passed"),
        ("not run here", f"{len(unrun)}" + (f": {', '.join(unrun)}" if unrun else "")),
        ("failed", f"{len(failed)}" + (f": {', '.join(failed)}" if failed else "")),
    ]


def _format(artifact: str) -> str | None:
    try:
        return parse(artifact).format
    except (KeyError, ValueError):
        return None


def load_snippet(header: Dict, winner: Dict, names: list[str]) -> str | None:
    """How to load the file to ship, in the words of the runtime it won on, with the model's input names."""
    file = winner.get("file")
    entry = next((a for a in header.get("artifacts") or [] if a.get("name") == winner.get("artifact")), {})
    kind = entry.get("kind") or _format(str(winner.get("artifact")))
    feeds = ", ".join(f'"{n}": {n}' for n in names)
    call = ", ".join(names)
    if not file or not kind:
        return None
    if kind == "onnx" and str(winner.get("runtime")).startswith("openvino"):
        return (
            "import openvino as ov\n"
            f'model = ov.Core().compile_model("{file}", "CPU")\n'
            f"outputs = model({{{feeds}}})"
        )
    if kind == "onnx":
        provider = "CUDAExecutionProvider" if "cuda" in str(winner.get("runtime")) else "CPUExecutionProvider"
        return (
            "import onnxruntime as ort\n"
            f'session = ort.InferenceSession("{file}", providers=["{provider}"])\n'
            f"outputs = session.run(None, {{{feeds}}})"
        )
    if kind == "onnx-packed":
        provider = "CUDAExecutionProvider" if "cuda" in str(winner.get("runtime")) else "CPUExecutionProvider"
        layout = repr((entry.get("details") or {}).get("packing") or {})  # a Python literal
        return (
            "import onnxruntime as ort\n"
            "from pipeline.core.packing import Packing  # the batch layout the packed graph takes\n"
            f"packing = Packing.from_json({layout})\n"
            f'session = ort.InferenceSession("{file}", providers=["{provider}"])\n'
            f"outputs = session.run(None, packing.pack({{{feeds}}}))"
        )
    if kind in ("exported-packed", "aoti-packed"):
        details = entry.get("details") or {}
        layout = repr(details.get("packing") or {})
        device = "cuda" if details.get("device") == "cuda" else "cpu"
        load = (
            f'torch.export.load("{file}").module()'
            if kind == "exported-packed"
            else f'torch._inductor.aoti_load_package("{file}")'
        )
        return (
            "import torch\n"
            "from pipeline.core.packing import Packing  # the batch layout the packed program takes\n"
            f"packing = Packing.from_json({layout})\n"
            f"model = {load}\n"
            f"packed = packing.pack({{{feeds}}})\n"
            f"order = {names!r} + packing.extra_inputs()\n"
            f'outputs = model(*(torch.from_numpy(packed[n]).to("{device}") for n in order))'
        )
    if kind == "torchscript":
        return f'import torch\nmodel = torch.jit.load("{file}")\noutputs = model({call})'
    if kind == "exported" and "cuda" in str(winner.get("runtime")):
        # traced on the CPU: moved as the runners move it, device arguments baked into the graph included
        fused = (entry.get("details") or {}).get("conv_epilogues")
        compile_note = (
            "# torch.compile of it needs the fused convolutions' meta kernels first:\n"
            "# from pipeline.toolchain.conv_epilogue import register_meta; register_meta()\n"
            if fused
            else ""
        )
        return (
            "import torch\nfrom torch.export.passes import move_to_device_pass\n"
            f'model = move_to_device_pass(torch.export.load("{file}"), "cuda").module()\n'
            f"{compile_note}outputs = model({call})  # inputs on the GPU"
        )
    if kind == "exported":
        return f'import torch\nmodel = torch.export.load("{file}").module()\noutputs = model({call})'
    if kind == "aoti":
        return f'import torch\nmodel = torch._inductor.aoti_load_package("{file}")\noutputs = model({call})'
    if kind == "engine":
        return (
            "import tensorrt\n"
            f'engine = tensorrt.Runtime(tensorrt.Logger()).deserialize_cuda_engine(open("{file}", "rb").read())'
        )
    return None
