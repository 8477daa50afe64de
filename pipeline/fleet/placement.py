"""Whether a Ray cluster can run a target at all, asked before anything is submitted: a task whose resources
no node has would wait forever (Ray keeps it pending for an autoscaler that may not exist)."""

from __future__ import annotations

from typing import Any

from pipeline.fleet.spec import Target


def missing_node(target: Target, nodes: list[dict[str, Any]]) -> str | None:
    """'no node with gpu:H200' (or with so many CPUs) when no live node offers what the target needs; None
    when one does."""
    alive = [n.get("Resources", {}) for n in nodes if n.get("Alive", n.get("alive", True))]
    need = target.resources()
    if any(all(node.get(k, 0.0) >= v for k, v in need.items()) for node in alive):
        return None
    gpu_keys = [k for k in need if k != "CPU"]
    with_gpu = [node for node in alive if all(node.get(k, 0.0) >= need[k] for k in gpu_keys)]
    if not with_gpu:
        have = sorted({k.removeprefix("accelerator_type:") for n in alive for k in n if k.startswith("acc")})
        count = f"{target.gpu.count} " if target.gpu and target.gpu.count > 1 else ""
        seen = f" (the cluster has: {', '.join(have)})" if have else ""
        return f"no node with {count}{target.label()}{seen}"
    most = max(int(node.get("CPU", 0)) for node in with_gpu)
    return f"no node with {target.cpu} CPUs for {target.label()} (the largest offers {most})"
