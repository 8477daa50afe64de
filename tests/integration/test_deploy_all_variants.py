"""Every variant of a small real model through a whole deploy: exports, precision variants, a TensorRT-RTX
engine built for real, validation, benchmark, sign-off. Engines cannot run here: they must be listed as
not run, with the reason, and never given a number."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

from tests.integration.test_deploy_cli import TINY, cli, sha

ALL = "[torchscript-fp32, onnx-fp32, onnx-fp16, onnx-int8, onnx-int8-dynamic, onnx-optimized-fp32, onnx-optimized-fp16, engine-fp16, engine-int8]"
OPENVINO = importlib.util.find_spec("openvino") is not None
# every CPU runtime, and OpenVINO (opt-in) where it is installed: its rows beside ONNX Runtime's
RUNTIMES = f"[torch-cpu, torchscript-cpu, onnxruntime-cpu{', openvino-cpu' if OPENVINO else ''}]"


@pytest.fixture(scope="module")
def version(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from pipeline.toolchain.trt.flavour import installed_flavours

    if not installed_flavours():
        pytest.skip("no TensorRT flavour installed (pip install 'deploy-pipeline[tensorrt-rtx]')")
    root = tmp_path_factory.mktemp("all")
    result = cli(
        "deploy",
        str(TINY),
        "--set",
        f"variants.build={ALL}",
        "--set",
        f"benchmark.runtimes={RUNTIMES}",
        root=root,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    return root / "tiny" / "v0001"


pytestmark = pytest.mark.tensorrt


def test_every_variant_is_an_artifact_with_its_hash(version: Path) -> None:
    manifest = json.loads((version / "manifest.json").read_text())
    files = {a["name"]: a for a in manifest["artifacts"]}
    flavour = next(n for n in files if n.endswith("-fp16") and n.startswith("tensorrt")).rsplit("-", 1)[0]
    expected = {
        "torchscript-fp32": "model.ts",
        "onnx-fp32": "model.onnx",
        "onnx-fp16": "model.fp16.onnx",
        "onnx-int8": "model.int8.onnx",
        "onnx-int8-dynamic": "model.int8-dynamic.onnx",
        "onnx-optimized-fp32": "model.optimized.onnx",
        "onnx-optimized-fp16": "model.optimized.fp16.onnx",
        f"{flavour}-fp16": f"model.{flavour}.fp16.engine",
        f"{flavour}-int8": f"model.{flavour}.int8.engine",
    }
    assert {n: a["path"] for n, a in files.items()} == expected
    for entry in files.values():
        assert sha(version / entry["path"]) == entry["sha256"]
    assert 0.5 < files["onnx-fp16"]["details"]["fp16_node_share"] <= 1
    int8 = files["onnx-int8"]["details"]
    assert (
        int8["calibration_method"] == "minmax"
        and len(int8["calibration_hash"]) == 64
        and int8["qdq_pairs"] > 0
    )
    assert files[f"{flavour}-fp16"]["kind"] == "engine"


def test_engines_record_their_build(version: Path) -> None:
    build = next(version.glob("logs/tensorrt*-fp16.build.json"))
    record = json.loads(build.read_text())
    assert record["ok"] is True and record["compute_capabilities"] == ["sm89"]
    assert record["profiles"] and record["layer_count"] > 0


def test_onnx_variants_pass_and_engines_are_not_run_with_a_reason(version: Path) -> None:
    accuracy = json.loads((version / "reports/accuracy.json").read_text())
    for name in ("onnx-fp16", "onnx-int8", "onnx-int8-dynamic", "onnx-optimized-fp32", "onnx-optimized-fp16"):
        assert accuracy["artifacts"][name]["passed"], accuracy["artifacts"][name]["reason"]
    not_run = {n["artifact"]: n["reason"] for n in accuracy["not_run"]}
    engines = [n for n in not_run if n.startswith("tensorrt")]
    assert len(engines) == 2 and all("GPU" in not_run[n] or "not runnable" in not_run[n] for n in engines)
    speed = json.loads((version / "reports/speed.json").read_text())
    assert not any(r["artifact"].startswith("tensorrt") for r in speed["results"])
    assert {n["artifact"] for n in speed["not_run"]} >= set(engines)
    markdown = (version / "reports/signoff.md").read_text()
    assert "not runnable on this host" in markdown or "no GPU" in markdown


@pytest.mark.skipif(
    not OPENVINO, reason="openvino is not installed (pip install 'deploy-pipeline[openvino]')"
)
def test_openvino_rows_are_validated_and_timed_on_their_own_runtime(version: Path) -> None:
    """The opt-in runtime, listed: the FP32 and static Q/DQ INT8 graphs are validated and timed on it like any
    other row; the graphs it does not run are named with why, and every claim of the sign-off holds."""
    from tests.claims import problems

    speed = json.loads((version / "reports/speed.json").read_text())
    accuracy = json.loads((version / "reports/accuracy.json").read_text())["artifacts"]
    rows = {(r["artifact"], r["runtime"], r["batch"]) for r in speed["results"]}
    for artifact in ("onnx-fp32", "onnx-int8"):
        for batch in (1, 2):
            assert (artifact, "openvino-cpu", batch) in rows and (artifact, "onnxruntime-cpu", batch) in rows
        assert accuracy[artifact]["runtimes"]["openvino-cpu"]["passed"], accuracy[artifact]
    declined = {
        e["artifact"]: e["reason"]
        for e in speed["conditions"]["runtimes_timed"]["not_timed"]
        if e["runtime"] == "openvino-cpu"
    }
    assert set(declined) == {"onnx-fp16", "onnx-int8-dynamic", "onnx-optimized-fp32", "onnx-optimized-fp16"}
    assert (
        "dynamically" in declined["onnx-int8-dynamic"] and "com.microsoft" in declined["onnx-optimized-fp32"]
    )
    assert not any(r == "openvino-cpu" for a, r, _ in rows if a in declined)
    assert problems(version) == []
