"""ONNX graphs with recurrent nodes (LSTM, GRU, RNN) are not offered ONNX Runtime's CUDA provider.

On an H100 host, ONNX Runtime 1.31.1 aborted the whole process (CUDA error 800, "operation not permitted", in
cudaFreeHost, then terminate) when a CUDA session that had run the zoo's recurrent tagger (an LSTM and a GRU) was
released: in 9 of 11 runs, with or without a CUDA-graph capture before it; that graph's capture failed too. An
abort ends the deploy that asked, so such graphs never get a CUDA session: they are found by reading the graph
(its subgraphs and local functions too), before any session is made. A CPU host validates and times them as
before; a GPU host, which times no CPU runtime of an ONNX graph, validates them on ONNX Runtime's CPU provider
and leaves them untimed, with this reason. Only that version was seen to abort; the reason says which one was
measured and which one is installed.
"""

from __future__ import annotations

import functools
from pathlib import Path

import onnx

RECURRENT_OPS = frozenset({"LSTM", "GRU", "RNN"})
MEASURED = "1.31.1"  # the ONNX Runtime release seen to abort


def recurrent_ops(path: Path) -> list[str]:
    """The recurrent op types in the graph at `path` (read once per file version; the weights are not read)."""
    stat = Path(path).stat()
    return list(_recurrent_ops(str(Path(path).resolve()), stat.st_size, stat.st_mtime_ns))


@functools.lru_cache(maxsize=64)
def _recurrent_ops(path: str, size: int, mtime_ns: int) -> tuple[str, ...]:
    return tuple(recurrent_in(onnx.load(path, load_external_data=False)))


def recurrent_in(model: onnx.ModelProto) -> list[str]:
    """The recurrent op types in a loaded graph, its subgraphs and local functions included."""
    found: set[str] = set()

    def walk(nodes: list[onnx.NodeProto]) -> None:
        for node in nodes:
            if node.op_type in RECURRENT_OPS and node.domain in ("", "ai.onnx"):
                found.add(node.op_type)
            for attribute in node.attribute:
                for graph in [attribute.g] if attribute.HasField("g") else attribute.graphs:
                    walk(list(graph.node))

    walk(list(model.graph.node))
    for function in model.functions:
        walk(list(function.node))
    return sorted(found)


def recurrent_reason(ops: list[str], version: str) -> str:
    """Why the CUDA provider is not offered for a graph with recurrent nodes, in a sentence the reports carry."""
    return (
        f"onnxruntime {MEASURED} aborted the process releasing a CUDA session that ran recurrent nodes (seen on "
        f"an H100; {version} is installed), and this graph has {', '.join(ops)}, so the CUDA provider is not "
        "offered for it"
    )
