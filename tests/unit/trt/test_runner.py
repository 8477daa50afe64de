"""Why an engine cannot run on a machine: the reasons the reports print."""

from pathlib import Path

from pipeline.core.artifacts import ArtifactRecord
from pipeline.runners.base import NotRunnable
from pipeline.runners.tensorrt import engine_flavour, not_runnable_reason, runners_for_engine
from pipeline.toolchain.trt.flavour import local_compute_capability


def engine(name: str = "tensorrt-rtx-fp16", **details) -> ArtifactRecord:
    return ArtifactRecord(name, Path("/nonexistent.engine"), "engine", "fp16", "0" * 64, name, details)


def test_no_gpu():
    reason = not_runnable_reason("tensorrt-rtx", ["sm89"], "1.7.1.116", None)
    assert reason == "no GPU: TensorRT-RTX engines need an NVIDIA GPU; not runnable on this host"


def test_rtx_refuses_hopper():
    reason = not_runnable_reason("tensorrt-rtx", ["sm89"], "1.7.1.116", "sm90")
    assert reason.startswith("TensorRT-RTX does not support compute capability 9.0 (built for sm89)")


def test_engine_built_for_another_gpu():
    assert not_runnable_reason("tensorrt-rtx", ["sm89"], None, "sm86").startswith(
        "engine built for sm89, this GPU is sm86"
    )
    assert not_runnable_reason("tensorrt", ["sm80"], None, "sm90").startswith(
        "engine built for sm80, this GPU is sm90"
    )


def test_flavour_from_details_or_name():
    assert engine_flavour(engine("tensorrt-fp16")) == "tensorrt"
    assert engine_flavour(engine("tensorrt-rtx-int8")) == "tensorrt-rtx"
    assert engine_flavour(engine("whatever", flavour="tensorrt-rtx")) == "tensorrt-rtx"


def test_not_runnable_on_this_host_without_a_gpu():
    if local_compute_capability() is not None:
        return  # covered by the gpu-marked tests
    result = runners_for_engine(engine(compute_capabilities=["sm89"], flavour="tensorrt-rtx"), settings=None)
    assert isinstance(result, NotRunnable)
    assert result.artifact == "tensorrt-rtx-fp16" and result.reason.startswith("no GPU")
