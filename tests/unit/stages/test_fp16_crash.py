"""A graph that crashes ONNX Runtime as it loads is one variant's failure, not the deploy's end: the FP16 copy
of a recurrent model (ONNX Runtime's CPU session segfaults loading it) fails the fp16 stage with the signal
named, and a graph it merely refuses is recorded as such."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
import torch
from onnx import TensorProto, helper
from torch import nn

from pipeline.core.errors import StageError
from pipeline.recipe import Fp16Export
from pipeline.stages.fp16 import convert, onnxruntime_check
from pipeline.toolchain import ort_probe


class Tagger(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.rnn = nn.LSTM(12, 24, num_layers=2, batch_first=True, bidirectional=True)
        self.gru = nn.GRU(48, 24, batch_first=True)
        self.head = nn.Linear(24, 7)

    def forward(self, features: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        states, _ = self.rnn(features)
        out, last = self.gru(states)
        return self.head(out), last[-1]


def test_a_graph_that_crashes_the_runtime_fails_the_fp16_variant_with_the_signal(tmp_path: Path) -> None:
    torch.manual_seed(0)
    fp32 = tmp_path / "model.onnx"
    with torch.no_grad():
        torch.onnx.export(
            Tagger().eval(),
            (torch.randn(2, 16, 12),),
            str(fp32),
            dynamo=False,
            input_names=["features"],
            output_names=["tags", "final"],
            dynamic_axes={"features": {0: "batch", 1: "sequence"}, "tags": {0: "batch", 1: "sequence"}},
        )
    assert ort_probe.load_problem(fp32) is None  # the FP32 graph loads
    fp16 = tmp_path / "model.fp16.onnx"
    onnx.save(convert(onnx.load(fp32), Fp16Export()), fp16)
    with pytest.raises(StageError, match=r"ONNX Runtime crashed loading model\.fp16\.onnx \(signal 11"):
        onnxruntime_check(fp16)


def test_a_graph_the_runtime_refuses_is_recorded_not_fatal(tmp_path: Path) -> None:
    weights = np.ones((4, 4), np.float32)
    graph = helper.make_graph(
        [helper.make_node("NoSuchOp", ["x", "w"], ["y"])],
        "bad",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])],
        [helper.make_tensor("w", TensorProto.FLOAT, weights.shape, weights.ravel())],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    path = tmp_path / "bad.onnx"
    onnx.save(model, path)
    message = onnxruntime_check(path)
    assert message.startswith(("InvalidGraph", "Fail", "NotImplemented")) and "NoSuchOp" in message, message
