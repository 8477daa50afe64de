from __future__ import annotations

import struct
import zlib
from pathlib import Path

import pytest

from pipeline.report.plots import write_plots
from tests.unit.report import samples


def _png_size(path: Path) -> tuple[int, int]:
    """Width and height from a PNG that is valid down to its chunk CRCs and a closing IEND."""
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    pos, chunks = 8, []
    while pos < len(data):
        (length,) = struct.unpack(">I", data[pos : pos + 4])
        kind, body = data[pos + 4 : pos + 8], data[pos + 8 : pos + 8 + length]
        (crc,) = struct.unpack(">I", data[pos + 8 + length : pos + 12 + length])
        assert zlib.crc32(kind + body) == crc
        chunks.append((kind, body))
        pos += 12 + length
    assert chunks[0][0] == b"IHDR" and chunks[-1][0] == b"IEND"
    assert not any(
        kind in (b"tEXt", b"iTXt", b"zTXt", b"tIME") and b"Software" in body for kind, body in chunks
    )
    return struct.unpack(">II", chunks[0][1][:8])


@pytest.fixture(scope="module")
def twice(tmp_path_factory) -> tuple[Path, list[str], list[str]]:
    """The sample plots written twice from fresh inputs into a/ and b/ (rendering is the slow part)."""
    root = tmp_path_factory.mktemp("plots")
    runs = [
        write_plots(root / name, samples.accuracy(), samples.speed(), samples.winner()) for name in ("a", "b")
    ]
    return root, runs[0], runs[1]


def test_writes_valid_non_trivial_pngs(twice):
    root, written, _ = twice
    assert written == ["reports/latency.png", "reports/accuracy.png"]
    for rel in written:
        path = root / "a" / rel
        width, height = _png_size(path)
        assert 400 <= width <= 1400 and 200 <= height <= 1400  # dpi 100: small, but readable
        assert path.stat().st_size > 10_000
    assert sorted(p.name for p in (root / "a" / "reports").iterdir()) == ["accuracy.png", "latency.png"]


def test_same_inputs_same_bytes(twice):
    root, first, second = twice
    assert first == second
    for rel in first:
        assert (root / "a" / rel).read_bytes() == (root / "b" / rel).read_bytes()


def test_empty_inputs_skip_plots(tmp_path):
    assert write_plots(tmp_path, None, None) == []
    empty_acc = {"schema_version": 1, "reference": "torch-fp32", "artifacts": {}, "not_run": []}
    empty_speed = {"schema_version": 1, "conditions": {}, "results": [], "not_run": []}
    assert write_plots(tmp_path, empty_acc, empty_speed) == []
    assert not (tmp_path / "reports").exists() or not any((tmp_path / "reports").iterdir())


def test_odd_values_still_plot(tmp_path, inputs):
    """A NaN error (fp16 overflow), an exact match (zero error), one row, no CI: still a picture, no crash."""
    checks = inputs["accuracy"]["artifacts"]["onnx-fp16"]["checks"]
    checks[0]["value"], checks[0]["passed"] = float("nan"), False
    inputs["accuracy"]["artifacts"]["onnx-fp32"]["checks"][1]["value"] = 0.0
    row = inputs["speed"]["results"][0]
    row.pop("p50_ci95_ms")
    inputs["speed"]["results"] = [row]
    written = write_plots(tmp_path, inputs["accuracy"], inputs["speed"], None)
    assert written == ["reports/latency.png", "reports/accuracy.png"]
    for rel in written:
        _png_size(tmp_path / rel)
