from __future__ import annotations

from pathlib import Path

import pytest

from pipeline.bench.timer import CpuTimer, CudaEventTimer, on_gpu, timer_for
from pipeline.runners.onnxruntime_runner import onnx_runners
from pipeline.runners.torch_runner import reference_runners
from tests.unit.runners.tiny_artifacts import export_onnx, tiny_context


@pytest.fixture(scope="module")
def ctx(tmp_path_factory: pytest.TempPathFactory):
    return tiny_context(tmp_path_factory.mktemp("timer"), intra_op_threads=1)


def test_cpu_runner_gets_perf_counter_around_a_returned_call(ctx, tmp_path: Path) -> None:
    artifact = export_onnx(ctx, tmp_path / "model.onnx")
    runner = onnx_runners(artifact, ctx.settings)[0]
    runner.activate()
    try:
        runner.prepare(ctx.dataset().feeds_at({"batch": 1, "sequence": 8}))
        timer = timer_for(runner)
        assert isinstance(timer, CpuTimer) and not on_gpu(runner)
        sample = timer.measure(runner)
        assert sample.ms > 0 and sample.wall_ms == sample.ms
    finally:
        runner.deactivate()


@pytest.mark.gpu
def test_gpu_runner_is_timed_with_cuda_events_on_its_stream(ctx) -> None:
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    runner = next(r for r in reference_runners(ctx.settings, ctx.model) if r.io == "device")
    runner.activate()
    try:
        runner.prepare(ctx.dataset().feeds_at({"batch": 2, "sequence": 16}))
        timer = timer_for(runner)
        assert isinstance(timer, CudaEventTimer) and timer.name == "cuda_events"
        samples = [timer.measure(runner) for _ in range(5)]
        assert all(s.ms > 0 and s.wall_ms > 0 for s in samples)
    finally:
        runner.deactivate()
