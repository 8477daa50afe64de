"""The runner base class guards the order of use: a runner is activated once before it runs, and released."""

from __future__ import annotations

import pytest

from pipeline.runners.base import RunnerStateError
from pipeline.runners.registry import reference_runners, runners_for


def test_inactive_runner_refuses_to_run_and_double_activation_is_an_error(ctx, onnx_artifact, feeds) -> None:
    runner = runners_for(onnx_artifact, ctx.settings)[0]
    with pytest.raises(RunnerStateError, match="infer while not active"):
        runner.infer(feeds)
    with pytest.raises(RunnerStateError, match="prepare while not active"):
        runner.prepare(feeds)
    runner.activate()
    try:
        with pytest.raises(RunnerStateError, match="activated twice"):
            runner.activate()
        assert set(runner.infer(feeds)) == {"hidden", "pooled"}
    finally:
        runner.deactivate()
    runner.deactivate()  # releasing an inactive runner is a no-op
    with pytest.raises(RunnerStateError):
        runner.infer_prepared()


def test_a_failed_activation_releases_what_it_took(ctx, feeds) -> None:
    import torch

    threads = torch.get_num_threads()

    def broken():
        raise OSError("no such model")

    runner = reference_runners(ctx.settings, broken)[0]  # pins CPU threads before it loads
    with pytest.raises(OSError, match="no such model"):
        runner.activate()
    assert not runner.is_active and torch.get_num_threads() == threads
    with pytest.raises(RunnerStateError):
        runner.infer(feeds)
