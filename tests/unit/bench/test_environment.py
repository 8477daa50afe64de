from __future__ import annotations

import json
import os
import socket

from pipeline.bench.environment import capture_environment


def test_environment_names_what_the_numbers_depend_on() -> None:
    env = capture_environment()
    for key in ("python", "torch", "onnx", "onnxruntime", "polygraphy", "tensorrt", "cpu", "gpu", "hostname"):
        assert key in env
    assert env["hostname"] == socket.gethostname()
    assert env["cpu"]["count"] == os.cpu_count()
    assert env["onnxruntime"]["version"] and "CPUExecutionProvider" in env["onnxruntime"]["providers"]
    assert env["torch"]["version"]
    for flavour in env["tensorrt"]:
        assert flavour["flavour"] in ("tensorrt", "tensorrt-rtx") and flavour["version"]
    json.dumps(env)  # goes into manifest.json as is
