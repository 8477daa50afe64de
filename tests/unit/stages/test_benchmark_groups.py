"""The benchmark's interleaving on a GPU host: GPU candidates among themselves, the CPU reference after them
(its intra-op threads would otherwise spin on the cores the GPU candidates launch from); a CPU host keeps one
group. Structural: the runners are built, not activated (no GPU here)."""

from __future__ import annotations

from pipeline.runners.pt2 import Pt2Runner
from pipeline.stages.benchmark import Candidate, _interleave_groups


def _candidate(runtime: str, device: str, io: str) -> Candidate:
    runner = Pt2Runner("exported-fp16", runtime, lambda: None, ["x"], ["y"], device, io)
    return Candidate(runner, "fp16")


def test_gpu_candidates_are_interleaved_apart_from_the_cpu_reference() -> None:
    cpu = _candidate("torch-cpu", "cpu", "host")
    device = _candidate("torch-cuda", "cuda", "device")
    host = _candidate("torch-cuda", "cuda", "host")  # host I/O of a GPU runtime is a GPU candidate
    groups = _interleave_groups([cpu, device, host])
    assert [[c.key for c in g] for g in groups] == [[device.key, host.key], [cpu.key]]


def test_a_cpu_host_keeps_one_group() -> None:
    a, b = _candidate("torch-cpu", "cpu", "host"), _candidate("torch-cpu-bucketed", "cpu", "host")
    assert [[c.key for c in g] for g in _interleave_groups([a, b])] == [[a.key, b.key]]
