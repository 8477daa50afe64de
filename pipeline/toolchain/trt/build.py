"""Build one TensorRT engine from an ONNX file: the body of the builder's child process.

Run as `python -m pipeline.toolchain.trt.build JOB.json`. The job names the ONNX, the engine to write, the flavour, the
optimization profiles and the rest of the build configuration; the child writes a JSON result beside the job
(ok, error, parser_errors, build_s, engine_bytes, layers ...) and exits 0 when the engine was built, 1 when the
build failed (the result says why). A child per build keeps each flavour's process-wide state (the
`tensorrt_rtx` module name, Polygraphy's flavour switch) apart and contains native crashes.

Engines are strongly typed: precision comes from the ONNX graph (float16 tensors, Q/DQ pairs), never from
builder flags. TensorRT 11 and TensorRT-RTX are strongly typed only; older builds get the flag.
"""

from __future__ import annotations

import json
import sys
import time
import traceback
from pathlib import Path
from typing import Any

from pipeline.core.children import serve_job
from pipeline.core.files import write_bytes_atomic
from pipeline.toolchain.trt.flavour import DISPLAY, import_trt, local_compute_capability, trt_version
from pipeline.toolchain.trt.layers import is_layer_listing, layers_from_inspector, layers_from_log


class BuildProblem(Exception):
    """A configuration the builder cannot honour (unsupported compute capability, a profile missing an input)."""


def make_logger(trt: Any, log_path: Path) -> Any:
    """A trt.ILogger that writes every message, verbose included, to the log file and keeps them for parsing."""

    class FileLogger(trt.ILogger):
        def __init__(self) -> None:
            trt.ILogger.__init__(self)
            self.file = open(log_path, "w", encoding="utf-8")  # noqa: SIM115 - lives as long as the build
            self.messages: list[str] = []
            self.errors: list[str] = []
            self.listing: list[str] = []

        def log(self, severity: Any, msg: str) -> None:
            level = getattr(severity, "name", str(severity))
            self.file.write(f"[{level}] {msg}\n")
            if is_layer_listing(msg):
                self.listing.append(msg)
            elif severity <= trt.ILogger.Severity.ERROR:
                self.errors.append(msg)

        def close(self) -> None:
            self.file.close()

    return FileLogger()


def network_flags(trt: Any) -> tuple[int, str]:
    """Creation flags for a strongly typed network, and a note on how typing was decided."""
    flag = getattr(trt.NetworkDefinitionCreationFlag, "STRONGLY_TYPED", None)
    if flag is None:
        return 0, "strongly typed by default (no STRONGLY_TYPED flag in this version)"
    return 1 << int(flag), "strongly typed (NetworkDefinitionCreationFlag.STRONGLY_TYPED)"


def parser_errors(parser: Any) -> list[dict[str, Any]]:
    """Every error the ONNX parser recorded, with the failing node's name and operator where known."""
    errors = []
    for i in range(parser.num_errors):
        err = parser.get_error(i)
        errors.append(
            {
                "message": str(err),
                "code": getattr(err.code(), "name", str(err.code())),
                "description": err.desc(),
                "node": err.node(),
                "node_name": err.node_name() or None,
                "node_operator": err.node_operator() or None,
                "where": f"{err.file()}:{err.line()} ({err.func()})",
            }
        )
    return errors


def set_profiles(builder: Any, network: Any, config: Any, profiles: list[dict[str, list]]) -> list[str]:
    """One optimization profile per entry: {input: [min, opt, max]}; returns notes on inputs it left alone."""
    notes = []
    inputs = [network.get_input(i) for i in range(network.num_inputs)]
    names = {t.name for t in inputs}
    for index, shapes in enumerate(profiles):
        profile = builder.create_optimization_profile()
        for tensor in inputs:
            dynamic = any(d < 0 for d in tensor.shape)
            if tensor.name not in shapes:
                if dynamic:
                    raise BuildProblem(
                        f"profile {index}: network input '{tensor.name}' has dynamic dims "
                        f"{tuple(tensor.shape)} but the recipe gives no shapes for it"
                    )
                continue
            lo, opt, hi = (tuple(s) for s in shapes[tensor.name])
            if not dynamic:
                if {lo, opt, hi} != {tuple(tensor.shape)}:
                    notes.append(
                        f"input '{tensor.name}' is static {tuple(tensor.shape)} in the ONNX; profile shapes ignored"
                    )
                continue
            profile.set_shape(tensor.name, lo, opt, hi)
        for extra in sorted(set(shapes) - names):
            notes.append(
                f"profile {index}: '{extra}' is not an input of the ONNX graph (unused by the export?); ignored"
            )
        if config.add_optimization_profile(profile) < 0:
            raise BuildProblem(f"profile {index} was rejected by the builder: {shapes}")
    return notes


def set_compute_capabilities(
    trt: Any, config: Any, flavour: str, wanted: list[str]
) -> tuple[list[str], list[str]]:
    """Target the recipe's compute capabilities ahead of time where the flavour can (TensorRT-RTX).

    Returns (the capabilities the engine targets, notes). A flavour without ahead-of-time targeting builds for
    the GPU it runs on, recorded as 'current'.
    """
    if flavour != "tensorrt-rtx" or not hasattr(trt, "ComputeCapability"):
        local = local_compute_capability() or "current"
        return [local], [
            f"{DISPLAY[flavour]} builds for the GPU it runs on ({local}); "
            "export.tensorrt.compute_capabilities applies to TensorRT-RTX only"
        ]
    supported = {
        name.lower(): member
        for name, member in trt.ComputeCapability.__members__.items()
        if name.startswith("SM")
    }
    unknown = [c for c in wanted if c not in supported]
    if unknown:
        listed = ", ".join(sorted(supported, key=lambda c: int(c[2:])))
        raise BuildProblem(
            f"{DISPLAY[flavour]} {trt_version(flavour)} cannot target {', '.join(unknown)}: it supports {listed}"
        )
    config.num_compute_capabilities = len(wanted)
    for i, name in enumerate(wanted):
        config.set_compute_capability(supported[name], i)
    return list(wanted), []


def load_timing_cache(config: Any, flavour: str, path: str | None) -> list[str]:
    """Attach a timing cache (datacenter flavour); TensorRT-RTX ignores timing caches, so none is used there."""
    if flavour == "tensorrt-rtx":
        return [
            "TensorRT-RTX ignores timing caches (its timing cache calls are no-ops): none loaded or saved"
        ]
    if not path:
        return ["no timing cache"]
    data = Path(path).read_bytes() if Path(path).is_file() else b""
    config.set_timing_cache(config.create_timing_cache(data), ignore_mismatch=False)
    return [f"timing cache {'loaded' if data else 'created'}: {path}"]


def save_timing_cache(config: Any, flavour: str, path: str | None) -> None:
    if flavour == "tensorrt-rtx" or not path:
        return
    cache = config.get_timing_cache()
    if cache is not None:
        write_bytes_atomic(Path(path), bytes(cache.serialize()))


def inspect_layers(trt: Any, logger: Any, engine_bytes: bytes) -> tuple[list[dict[str, Any]], str]:
    """The layer listing and its source: the engine inspector when the engine deserializes here, else the log."""
    try:
        engine = trt.Runtime(logger).deserialize_cuda_engine(engine_bytes)
    except Exception:  # a runtime that cannot start here (no GPU, unsupported GPU) may raise or return None
        engine = None
    if engine is not None:
        inspector = engine.create_engine_inspector()
        return layers_from_inspector(
            inspector.get_engine_information(trt.LayerInformationFormat.JSON)
        ), "engine-inspector"
    return layers_from_log(logger.listing), "builder-log"


def configure(trt: Any, builder: Any, network: Any, job: dict[str, Any]) -> tuple[Any, list[str], list[str]]:
    """The builder config for a job: profiles, compute capabilities, level, workspace, verbosity, timing cache."""
    config = builder.create_builder_config()
    notes = set_profiles(builder, network, config, job["profiles"])
    targets, cc_notes = set_compute_capabilities(trt, config, job["flavour"], job["compute_capabilities"])
    config.builder_optimization_level = job["optimization_level"]
    config.set_memory_pool_limit(trt.MemoryPoolType.WORKSPACE, job["workspace_mb"] << 20)
    config.profiling_verbosity = trt.ProfilingVerbosity.DETAILED
    notes += cc_notes + load_timing_cache(config, job["flavour"], job.get("timing_cache"))
    return config, targets, notes


def build(job: dict[str, Any]) -> dict[str, Any]:
    """Run one build; never raises: every failure is described in the result."""
    flavour = job["flavour"]
    result: dict[str, Any] = {
        "ok": False,
        "error": None,
        "parser_errors": [],
        "flavour": flavour,
        "trt_version": trt_version(flavour),
        "profiles": job["profiles"],
        "optimization_level": job["optimization_level"],
        "workspace_mb": job["workspace_mb"],
        "compute_capabilities": job["compute_capabilities"],
        "notes": [],
    }
    logger = None
    try:
        trt = import_trt(flavour)
        logger = make_logger(trt, Path(job["log"]))
        _build(trt, logger, job, result)
    except BuildProblem as exc:
        result["error"] = str(exc)
    except Exception as exc:  # a bug or an unexpected binding error: keep the traceback in the result
        result["error"] = f"{type(exc).__name__}: {exc}"
        result["traceback"] = traceback.format_exc()
    finally:
        if logger is not None:
            logger.close()
    return result


def _build(trt: Any, logger: Any, job: dict[str, Any], result: dict[str, Any]) -> None:
    builder = trt.Builder(logger)
    if builder is None:
        raise BuildProblem(
            f"could not create a {DISPLAY[job['flavour']]} builder: {'; '.join(logger.errors[-3:])}"
        )
    flags, typing_note = network_flags(trt)
    network = builder.create_network(flags)
    parser = trt.OnnxParser(network, logger)
    progress(f"parsing {job['onnx']}")
    if not parser.parse_from_file(str(job["onnx"])):
        result["parser_errors"] = parser_errors(parser)
        first = result["parser_errors"][0]["message"] if result["parser_errors"] else "no detail"
        raise BuildProblem(
            f"the ONNX parser rejected the graph ({len(result['parser_errors'])} errors): {first}"
        )
    config, targets, notes = configure(trt, builder, network, job)
    result["compute_capabilities"] = targets
    result["notes"] = [typing_note, *notes]
    progress(f"building ({', '.join(targets)}, level {job['optimization_level']})")
    start = time.perf_counter()
    serialized = builder.build_serialized_network(network, config)
    result["build_s"] = round(time.perf_counter() - start, 3)
    if serialized is None:
        raise BuildProblem(
            f"the builder produced no engine: {'; '.join(logger.errors[-5:]) or 'see the build log'}"
        )
    engine_bytes = bytes(serialized)
    write_bytes_atomic(Path(job["engine"]), engine_bytes)
    save_timing_cache(config, job["flavour"], job.get("timing_cache"))
    progress(f"built {len(engine_bytes)} bytes in {result['build_s']} s")
    layers, source = inspect_layers(trt, logger, engine_bytes)
    write_bytes_atomic(
        Path(job["layers"]),
        json.dumps({"source": source, "count": len(layers), "layers": layers}, indent=1).encode(),
    )
    result.update(ok=True, engine_bytes=len(engine_bytes), layer_count=len(layers), layers_source=source)
    if source == "builder-log":
        result["notes"].append(
            "engine not deserializable here (no suitable GPU): layers parsed from the verbose builder log"
        )


def progress(message: str) -> None:
    print(f"[trt-build] {message}", flush=True)


def main(argv: list[str] | None = None) -> int:
    return serve_job(argv, "pipeline.toolchain.trt.build", "trt-build", build)


if __name__ == "__main__":
    sys.exit(main())
