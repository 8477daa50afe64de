"""The AOTInductor toolchain: compiling an ExportedProgram into a package for a device (run in a child,
pipeline/toolchain/aoti_child.py), and the Inductor setting both the compile and a package's load need."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any


@contextlib.contextmanager
def no_cpu_isa_probe(device: str) -> Iterator[None]:
    """Inductor's config for compiling or loading an AOTInductor package that runs on `device`: off the CPU,
    the CPU vector-ISA probe answers "none" without probing.

    Both the compile and the load ask Inductor which CPU vector ISA the machine has (for the wrapper's
    compile flags; to compare with what the package recorded). torch 2.11 answers by building and loading a
    test library per ISA, each load in a fresh Python that imports torch: 40-50 s on the H200 host at each
    compile and at the first load in a process, for a GPU package whose wrapper only launches GPU kernels.
    `cpp.vec_isa_ok=False` answers at once: the wrapper is built without SIMD flags (no CPU kernel to
    vectorize) and a load compares against the same answer the compile recorded. Inductor caches the answer
    for the rest of the process: the compile runs in a child of its own, and the deploy process compiles no
    CPU kernels with Inductor (CPU packages compile in their child and keep the probe: their kernels need the
    real ISA)."""
    if device == "cpu":
        yield
        return
    import torch._inductor.config as inductor_config

    with inductor_config.patch({"cpp.vec_isa_ok": False}):
        yield


def compile_aoti(
    source: Path, target: Path, device: str, max_autotune: bool
) -> tuple[str, float, dict[str, Any]]:
    """AOTInductor package of an ExportedProgram for `device`; returns its path, compile seconds, device info."""
    import torch
    from torch.export.passes import move_to_device_pass

    from pipeline.toolchain.conv_epilogue import register_meta

    register_meta()  # Inductor traces cuDNN's fused convolutions (conv_epilogue.py) through it
    program = torch.export.load(str(source))
    if device != "cpu":
        program = move_to_device_pass(program, torch.device(device, 0) if device == "cuda" else device)
    torch._dynamo.utils.compilation_time_metrics.clear()  # the log's phase times: this compile's, not the process's
    started = time.perf_counter()
    with no_cpu_isa_probe(device):  # not within inductor_configs: the probe also runs outside that patch
        path = torch._inductor.aoti_compile_and_package(
            program, package_path=str(target), inductor_configs={"max_autotune": max_autotune}
        )
    print(torch._dynamo.utils.compile_times(repr="str", aggregate=True))  # where the seconds went (the log)
    return str(path), time.perf_counter() - started, device_info(device)


def device_info(device: str) -> dict[str, Any]:
    import torch

    if device == "cpu":
        return {"device": "cpu"}
    major, minor = torch.cuda.get_device_capability(0)
    return {"device": "cuda", "gpu": torch.cuda.get_device_name(0), "compute_capability": f"{major}.{minor}"}
