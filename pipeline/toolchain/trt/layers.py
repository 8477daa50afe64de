"""The layer listing of a built engine: from the engine inspector, or parsed from the builder's verbose log.

TensorRT-RTX engines built ahead of time on a machine without a suitable GPU cannot be deserialized there, so
the inspector is unavailable; with ProfilingVerbosity.DETAILED the builder logs the same listing ("Layers:"
followed by one "Name: ..., LayerType: ..." line per layer), which is parsed here instead.
"""

from __future__ import annotations

import json
import re
from typing import Any

_TENSOR = re.compile(r"\{ Name: ([^,]*), Dimensions: \[([^\]]*)\].*?Datatype: (\w+)")
_HEAD = re.compile(r"^Name: (?P<name>.*?), LayerType: (?P<type>[^,]*)")
_TACTIC = re.compile(r"TacticName: (?P<tactic>.*?), StreamId")
_ONNX_NODE = re.compile(r"\[ONNX Layer: ([^\]]*)\]")
# The older one-line form: "Layer(Myelin): name, Tactic: 0x..., in (Float[-1,4]) -> out (Float[-1,4])"
_LEGACY = re.compile(r"^Layer\((?P<type>[^)]*)\): (?P<name>.*?), Tactic: (?P<tactic>\S+?),? (?P<io>.*)$")


def _section(line: str, key: str, following: str) -> str:
    start = line.find(f"{key}: [")
    end = line.find(f"], {following}:", start) if start >= 0 else -1
    return line[start:end] if start >= 0 and end >= 0 else ""


def _tensors(text: str) -> list[dict[str, Any]]:
    return [{"name": m.group(1), "dims": m.group(2), "dtype": m.group(3)} for m in _TENSOR.finditer(text)]


def parse_layer_line(line: str) -> dict[str, Any] | None:
    """One layer of the builder's listing as a dict (name, type, tactic, inputs, outputs), None if not a layer."""
    head = _HEAD.match(line)
    if head:
        tactic = _TACTIC.search(line)
        return {
            "name": head.group("name"),
            "type": head.group("type"),
            "tactic": tactic.group("tactic") if tactic else None,
            "inputs": _tensors(_section(line, "Inputs", "Constants")),
            "outputs": _tensors(_section(line, "Outputs", "TacticName")),
            "onnx_nodes": _ONNX_NODE.findall(line),
        }
    legacy = _LEGACY.match(line)
    if legacy:
        ins, _, outs = legacy.group("io").partition(" -> ")
        return {
            "name": legacy.group("name"),
            "type": legacy.group("type"),
            "tactic": legacy.group("tactic"),
            "inputs": [{"name": t.strip()} for t in ins.split(", ") if t.strip()],
            "outputs": [{"name": t.strip()} for t in outs.split(", ") if t.strip()],
            "onnx_nodes": [],
        }
    return None


def is_layer_listing(message: str) -> bool:
    """True for the builder's log message that carries the layer listing."""
    head = message.lstrip()
    return head.startswith("Layers:") or head.startswith("Engine Layer Information:")


def layers_from_log(messages: list[str]) -> list[dict[str, Any]]:
    """Layers from the last listing message in the builder's log (the final engine's), [] if none."""
    listing = [m for m in messages if is_layer_listing(m)]
    if not listing:
        return []
    layers = []
    for line in listing[-1].splitlines()[1:]:
        if not line.strip():
            break  # the listing ends before the I/O tensor table
        layer = parse_layer_line(line.strip())
        if layer is not None:
            layers.append(layer)
    return layers


def layers_from_inspector(info_json: str) -> list[dict[str, Any]]:
    """Layers from IEngineInspector.get_engine_information(JSON), normalized to the log form's keys."""
    info = json.loads(info_json)
    out = []
    for layer in info.get("Layers", []):
        if isinstance(layer, str):  # ProfilingVerbosity below DETAILED lists names only
            out.append(
                {"name": layer, "type": None, "tactic": None, "inputs": [], "outputs": [], "onnx_nodes": []}
            )
            continue
        out.append(
            {
                "name": layer.get("Name"),
                "type": layer.get("LayerType"),
                "tactic": layer.get("TacticName") or layer.get("TacticValue"),
                "inputs": [_io(t) for t in layer.get("Inputs", [])],
                "outputs": [_io(t) for t in layer.get("Outputs", [])],
                "onnx_nodes": _ONNX_NODE.findall(str(layer.get("Metadata", ""))),
            }
        )
    return out


def _io(tensor: dict[str, Any]) -> dict[str, Any]:
    dims = tensor.get("Dimensions", [])
    return {
        "name": tensor.get("Name"),
        "dims": ",".join(str(d) for d in dims),
        "dtype": tensor.get("Format/Datatype"),
    }
