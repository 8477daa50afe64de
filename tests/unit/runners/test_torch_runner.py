from __future__ import annotations

import numpy as np
import pytest
import torch

from pipeline.runners.torch_runner import REFERENCE, reference_runners, torchscript_runners
from tests.unit.runners.tiny_artifacts import expected


def test_reference_runner_is_the_eager_module(ctx, feeds) -> None:
    runner = reference_runners(ctx.settings, ctx.model)[0]
    assert (runner.artifact, runner.runtime, runner.io) == (REFERENCE, "torch-cpu", "host")
    runner.activate()
    try:
        out = runner.infer(feeds)
        runner.prepare(feeds)
        runner.infer_prepared()
    finally:
        runner.deactivate()
    ref = expected(ctx, feeds)
    assert list(out) == list(ctx.recipe.outputs)
    for name in ref:
        np.testing.assert_array_equal(out[name], ref[name])


def test_torchscript_runner_matches_the_module(ctx, torchscript_artifact, feeds) -> None:
    runner = torchscript_runners(torchscript_artifact, ctx.settings)[0]
    assert (runner.artifact, runner.runtime, runner.io) == ("torchscript-fp32", "torchscript-cpu", "host")
    runner.activate()
    try:
        out = runner.infer(feeds)
    finally:
        runner.deactivate()
    ref = expected(ctx, feeds)
    for name in ref:
        np.testing.assert_allclose(out[name], ref[name], atol=1e-5)


def test_cpu_threads_are_pinned_while_active_and_restored(ctx) -> None:
    before = torch.get_num_threads()
    runner = reference_runners(ctx.settings, ctx.model)[0]  # the ctx fixture pins intra_op_threads = 1
    runner.activate()
    try:
        assert torch.get_num_threads() == 1
    finally:
        runner.deactivate()
    assert torch.get_num_threads() == before


def test_missing_input_is_named(ctx, feeds) -> None:
    runner = reference_runners(ctx.settings, ctx.model)[0]
    runner.activate()
    try:
        with pytest.raises(KeyError, match="attention_mask"):
            runner.infer({"input_ids": feeds["input_ids"]})
    finally:
        runner.deactivate()


@pytest.mark.gpu
def test_cuda_device_runner_keeps_io_on_the_gpu(ctx, feeds) -> None:
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    runners = {(r.runtime, r.io): r for r in reference_runners(ctx.settings, ctx.model)}
    runner = runners[("torch-cuda", "device")]
    runner.activate()
    try:
        runner.prepare(feeds)
        runner.infer_prepared()
        runner.synchronize()
        assert runner._result[0].is_cuda
        out = runner.infer(feeds)
    finally:
        runner.deactivate()
    assert next(ctx.model().module.parameters()).device.type == "cpu"  # the shared reference stayed put
    for name, ref in expected(ctx, feeds).items():
        np.testing.assert_allclose(out[name], ref, atol=1e-4)
