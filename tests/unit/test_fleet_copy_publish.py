"""The driver's side of `store: copy` without Ray: a version's files streamed in chunks (several per file) are
checked against its manifest and published by the store's own publication, or refused with a located reason
and nothing left behind. The end-to-end runs through Ray are tests/integration/test_fleet_copy.py."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pipeline.core.files import sha256_file, write_json_atomic
from pipeline.fleet import transfer
from pipeline.fleet.copy_publish import CopyFailed, publish_copy
from pipeline.fleet.seed import Seed
from pipeline.release.store import MANIFEST, SEAL, Store, manifest_digest


def _node_version(folder: Path) -> Path:
    """A sealed version as a node's deploy publishes it: two files and a manifest listing them."""
    (folder / "reports").mkdir(parents=True)
    (folder / "model.onnx").write_bytes(bytes(range(256)) * 40)  # 10,240 bytes: several chunks below
    (folder / "reports" / "signoff.md").write_text("signed off\n")
    files = [{"path": p, "sha256": sha256_file(folder / p)} for p in ("model.onnx", "reports/signoff.md")]
    manifest = {"version": folder.name, "signed_off": True, "promoted": True, "artifacts": files[:1]}
    manifest["files"] = files[1:]
    manifest[SEAL] = manifest_digest(manifest)
    write_json_atomic(folder / MANIFEST, manifest)
    return folder


def _copy(node: Path, version: str = "v0001") -> dict:
    return {
        "document": {"version": version, "status": "signed_off", "signed_off": True, "path": str(node)},
        "copy": {
            "version": version,
            "files": transfer.list_files(node),
            "latest": version,
            "promotions": [{"version": version, "at": "then", "by": "deploy"}],
            "node": "n1",
        },
    }


SEED = Seed("tiny", None, None, (), None, 5.0)


@pytest.fixture(autouse=True)
def _small_chunks(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(transfer, "CHUNK_BYTES", 1000)  # a file of several chunks, as a large artifact is


def test_a_copy_that_matches_its_manifest_is_published_as_the_next_version(tmp_path: Path) -> None:
    node = _node_version(tmp_path / "node" / "v0001")
    store = Store(tmp_path / "shared", "tiny")
    result = _copy(node)
    files = result["copy"]["files"]
    done = publish_copy(transfer.read_chunks(node, files), result, store, SEED)
    folder = store.version_folder("v0001")
    assert done["document"]["path"] == str(folder.resolve()) and "copy" not in done
    assert store.verify("v0001") == [] and store.latest() == folder
    assert [e["version"] for e in store.promotions()] == ["v0001"]
    for rel, _ in files:
        assert (folder / rel).read_bytes() == (node / rel).read_bytes()
    assert store.leftover_work_dirs() == []


@pytest.mark.parametrize(
    ("damage", "why"),
    [
        ("flip", "model.onnx sha256 differs from the manifest"),
        ("drop", "model.onnx is missing from the copy"),
        ("extra", "stray.txt is not in the manifest"),
        ("short", "reports/signoff.md: missing (the copy ended early)"),
    ],
)
def test_a_copy_that_differs_from_its_manifest_publishes_nothing(
    tmp_path: Path, damage: str, why: str
) -> None:
    node = _node_version(tmp_path / "node" / "v0001")
    if damage == "extra":
        (node / "stray.txt").write_text("x")
    result = _copy(node)
    files = result["copy"]["files"]
    if damage == "drop":
        result["copy"]["files"] = files = [f for f in files if f[0] != "model.onnx"]
    alter = (
        (lambda rel, data: b"\xff" + data[1:] if rel == "model.onnx" else data) if damage == "flip" else None
    )
    chunks = transfer.read_chunks(node, files, alter) if alter else transfer.read_chunks(node, files)
    if damage == "short":
        chunks = iter(list(chunks)[:-1])
    store = Store(tmp_path / "shared", "tiny")
    with pytest.raises(CopyFailed) as caught:
        publish_copy(chunks, result, store, SEED)
    assert str(caught.value).startswith("copy of tiny/v0001 from node n1: "), caught.value
    assert why in str(caught.value) and str(caught.value).endswith("nothing published")
    assert store.versions() == [] and store.latest() is None and store.leftover_work_dirs() == []


def test_a_copy_numbered_before_another_deploy_published_is_refused(tmp_path: Path) -> None:
    store = Store(tmp_path / "shared", "tiny")
    _node_version(store.base / "v0001")  # published in the shared store while the node deployed
    node = _node_version(tmp_path / "node" / "v0001")
    result = _copy(node)
    with pytest.raises(CopyFailed, match="v0001 was published in the shared store while the deploy ran"):
        publish_copy(transfer.read_chunks(node, result["copy"]["files"]), result, store, SEED)
    assert store.versions() == ["v0001"] and json.loads((store.base / "v0001" / MANIFEST).read_text())
