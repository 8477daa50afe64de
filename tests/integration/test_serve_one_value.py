"""Tensors of one value per sample ([batch]: a per-sample offset in, an int64 class label out), exported for
real and served for real: the Triton repository of `export.triton: true` gives them dims [ 1 ] reshaped to [ ]
(Triton refuses empty dims), the sign-off's configuration check catches empty dims, and `serve` puts the
model behind a real Triton server (PyTriton) that loads it and answers [batch, 1]."""

from __future__ import annotations

import signal
from pathlib import Path

import numpy as np
import pytest

from tests.integration.test_deploy_cli import cli
from tests.serve_process import start_serve, winner_outputs

RECIPE = """
name: labeller
model: {source: entrypoint, entrypoint: "tests.models.tiny:labeller", seed: 0}
inputs:
  - {name: x, dtype: float32, shape: [batch, 8]}
  - {name: offset, dtype: float32, shape: [batch]}
dims:
  batch: {min: 1, opt: 2, max: 8}
outputs: [embedding, label]
data:
  samples: {source: random, samples: 16}
  calibration: 8
  validation: 8
variants:
  build: [onnx-fp32]
  required: [onnx-fp32]
benchmark:
  batch_sizes: [1, 2]
  warmup_s: 0.05
  min_s: 0.1
  window_s: 0.05
  max_s: 0.3
selection:
  objective: {metric: p50_ms, batch: 1}
export:
  triton: true
"""


@pytest.fixture(scope="module")
def deployed(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """(the recipe, the signed-off version folder)."""
    folder = tmp_path_factory.mktemp("labeller")
    recipe = folder / "labeller.yaml"
    recipe.write_text(RECIPE)
    result = cli("deploy", str(recipe), root=folder / "out")
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    return recipe, folder / "out/labeller/v0001"


def _model_config(path: Path):
    pytest.importorskip("tritonclient", reason="the triton extra carries Triton's ModelConfig protobuf")
    from google.protobuf import text_format
    from tritonclient.grpc import model_config_pb2

    return text_format.Parse(path.read_text(), model_config_pb2.ModelConfig())


def test_one_value_per_sample_is_dims_1_reshaped_to_a_scalar(deployed: tuple[Path, Path]) -> None:
    _, version = deployed
    config = _model_config(version / "triton/labeller/config.pbtxt")
    assert config.max_batch_size == 8
    tensors = {t.name: t for t in [*config.input, *config.output]}
    for name in ("offset", "label"):
        assert list(tensors[name].dims) == [1], tensors[name]
        assert tensors[name].HasField("reshape") and list(tensors[name].reshape.shape) == []
    for name, dims in (("x", [8]), ("embedding", [4])):
        assert list(tensors[name].dims) == dims and not tensors[name].HasField("reshape")
    (warmup,) = config.model_warmup
    assert list(warmup.inputs["offset"].dims) == [1]  # the client-side shape, as Triton checks it
    text = (version / "triton/labeller/config.pbtxt").read_text()
    assert "from its own ONNX graph, the recipe's dims and the benchmark." in text


def test_the_configuration_check_refuses_empty_dims(deployed: tuple[Path, Path], tmp_path: Path) -> None:
    """What the sign-off and `verify` run: the written repository passes; the same with the label's dims
    emptied (what Triton refuses with "must specify 'dims'") does not."""
    from pipeline.release.triton import config_problems

    _, version = deployed
    _model_config(version / "triton/labeller/config.pbtxt")  # skips without tritonclient
    assert config_problems(version) == []
    copy = tmp_path / "triton/labeller"
    copy.mkdir(parents=True)
    text = (version / "triton/labeller/config.pbtxt").read_text()
    broken = text.replace("dims: [ 1 ]\n    reshape: { shape: [ ] }", "dims: [  ]")
    assert broken != text
    (copy / "config.pbtxt").write_text(broken)
    problems = config_problems(tmp_path)
    assert len(problems) == 2 and all(p.startswith("triton/labeller/config.pbtxt: model ") for p in problems)
    assert any("output 'label' must specify 'dims'" in p for p in problems), problems
    verify = cli("verify", str(deployed[0]), "v0001", root=version.parents[1])
    assert verify.returncode == 0, verify.stdout + verify.stderr


def test_serve_loads_it_and_answers_batch_by_1(deployed: tuple[Path, Path]) -> None:
    """A real Triton server started by `serve` loads the model (it refused it before: exit 2, "model output
    'label' must specify 'dims'") and answers as the winner's runner does, one value per sample as [batch, 1]."""
    pytest.importorskip("pytriton", reason="the serve extra: pip install 'deploy-pipeline[serve]'")
    import tritonclient.http as http

    recipe, version = deployed
    promoted = cli("promote", str(recipe), "v0001", root=version.parents[1])
    assert promoted.returncode == 0, promoted.stderr
    server, _, port = start_serve(recipe, version.parents[1])
    try:
        rng = np.random.default_rng(1)
        feeds = {
            "x": rng.standard_normal((2, 8)).astype(np.float32),
            "offset": np.array([0.5, -3], np.float32),
        }
        client = http.InferenceServerClient(f"127.0.0.1:{port}")
        inputs = []
        for name, array in feeds.items():
            wire = array.reshape(2, 1) if array.ndim == 1 else array  # dims [ 1 ]: [batch, 1] on the wire
            tensor = http.InferInput(name, list(wire.shape), "FP32")
            tensor.set_data_from_numpy(wire)
            inputs.append(tensor)
        answer = client.infer("labeller", inputs)
        config = client.get_model_config("labeller")
        assert {o["name"]: o["dims"] for o in config["output"]}["label"] == [1]
        expected = winner_outputs(version, feeds)
        assert expected["label"].shape == (2,)
        assert answer.as_numpy("label").shape == (2, 1)
        np.testing.assert_array_equal(answer.as_numpy("label")[:, 0], expected["label"])
        np.testing.assert_allclose(answer.as_numpy("embedding"), expected["embedding"], rtol=1e-5, atol=1e-6)
        server.send_signal(signal.SIGTERM)
        rest, _ = server.communicate(timeout=60)
        assert server.returncode == 0, rest
    finally:
        if server.poll() is None:
            server.kill()
            server.communicate(timeout=30)


def test_a_server_refusing_the_pipelines_own_configuration_is_a_bug() -> None:
    """Where PyTriton sits in the interpreter's own environment, a model the server does not load is the
    configuration or binding the pipeline made: exit 3 with its reason, not a user error (exit 2)."""
    pytest.importorskip("pytriton", reason="the serve extra: pip install 'deploy-pipeline[serve]'")
    from pipeline.release.triton_server import _environment_hint, _not_loaded

    if _environment_hint():
        pytest.skip("PyTriton is installed outside this interpreter's environment")
    error = _not_loaded("model output 'label' must specify 'dims'")
    assert error.exit_code == 3
    assert error.lines()[0].endswith(
        "could not load the model the pipeline configured: model output 'label' must specify 'dims'"
    )
    assert error.lines()[-1] == "internal error: this is a bug in the pipeline (exit 3)"
