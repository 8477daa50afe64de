"""Explicit promotion, as a user meets it: a `--set` experiment is published as a candidate and `latest` stays
where it was, until `--promote` or `python -m pipeline promote` moves it; `list` says which is which."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.integration.test_deploy_cli import TINY, cli

EXPERIMENT = ["--set", "benchmark.batch_sizes=[1]"]


def _list(root: Path) -> dict[str, dict]:
    result = cli("list", str(TINY), "--json", root=root)
    assert result.returncode == 0, result.stderr
    return {row["version"]: row for row in json.loads(result.stdout)["versions"]}


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """v0001 from the recipe file, then v0002 from the same recipe with one --set."""
    root = tmp_path_factory.mktemp("promotion")
    plain = cli("deploy", str(TINY), root=root)
    assert plain.returncode == 0, plain.stderr[-2000:]
    experiment = cli("deploy", str(TINY), *EXPERIMENT, root=root)
    assert experiment.returncode == 0, experiment.stderr[-2000:]
    assert "candidate: tiny/v0002 is not latest (--set changes benchmark.batch_sizes)" in experiment.stdout
    # the command it prints finds this store
    assert f"promote {TINY} v0002 --set output.root={root}" in experiment.stdout
    return root


def test_a_set_experiment_does_not_move_latest(store: Path) -> None:
    assert (store / "tiny" / "latest").readlink() == Path("v0001")
    plain = cli("deploy", str(TINY), root=store)
    assert plain.returncode == 0 and plain.stdout.strip().endswith("up to date: tiny/v0001"), plain.stdout
    again = cli("deploy", str(TINY), *EXPERIMENT, root=store)  # judged against the candidate it repeats
    assert again.returncode == 0 and again.stdout.strip().endswith("up to date: tiny/v0002"), again.stdout
    rows = _list(store)
    assert sorted(rows) == ["v0001", "v0002"]
    assert rows["v0001"]["latest"] and not rows["v0001"]["candidate"]
    assert not rows["v0001"]["promoted"]  # a plain deploy moving latest is not a promotion on purpose
    assert rows["v0002"]["candidate"] and not rows["v0002"]["latest"] and not rows["v0002"]["promoted"]
    assert rows["v0002"]["recipe_changes"] == ["benchmark.batch_sizes"]
    shown = cli("list", str(TINY), root=store).stdout
    assert "(latest)" in shown and "(candidate: --set changes benchmark.batch_sizes)" in shown


def test_promote_moves_latest_to_a_signed_off_intact_version_only(store: Path) -> None:
    missing = cli("promote", str(TINY), "v0009", root=store)
    assert missing.returncode == 2 and "no such version (versions: v0001, v0002)" in missing.stderr
    promoted = cli("promote", str(TINY), "v0002", root=store)
    assert promoted.returncode == 0, promoted.stderr
    assert promoted.stdout.strip() == "promoted: tiny/latest -> v0002 (was v0001)"
    assert (store / "tiny" / "latest").readlink() == Path("v0002")
    log = json.loads((store / "tiny" / "promotions.json").read_text())["promotions"]
    assert [(e["version"], e["by"]) for e in log] == [("v0001", "deploy"), ("v0002", "promote")]
    rows = _list(store)
    assert rows["v0002"]["latest"] and rows["v0002"]["promoted"] and not rows["v0001"]["promoted"]
    model = store / "tiny" / "v0001" / "model.onnx"
    model.chmod(0o644)
    with model.open("r+b") as f:  # one damaged byte
        f.seek(100)
        byte = f.read(1)
        f.seek(100)
        f.write(bytes([byte[0] ^ 0xFF]))
    damaged = cli("promote", str(TINY), "v0001", root=store)
    assert damaged.returncode == 2 and "damaged, not promoted: model.onnx" in damaged.stderr, damaged.stderr
    assert (store / "tiny" / "latest").readlink() == Path("v0002")


def test_deploy_promote_makes_a_candidate_latest(tmp_path: Path) -> None:
    result = cli("deploy", str(TINY), *EXPERIMENT, "--promote", root=tmp_path)
    assert result.returncode == 0, result.stderr[-2000:]
    assert (tmp_path / "tiny" / "latest").readlink() == Path("v0001")
    assert "candidate:" not in result.stdout
    manifest = json.loads((tmp_path / "tiny" / "v0001" / "manifest.json").read_text())
    assert manifest["recipe_changes"] == ["benchmark.batch_sizes"] and manifest["promoted"] is True


def test_a_copied_version_folder_is_verified_and_compared_as_itself(store: Path, tmp_path: Path) -> None:
    """A release handed on as a folder (renamed on the way) verifies by its own bytes, through the folder or
    its recipe.yaml, and compares; a damaged byte in the copy is the copy's, not the store's."""
    import shutil

    copy = tmp_path / "release-candidate"
    shutil.copytree(store / "tiny" / "v0002", copy)
    for target in (copy, copy / "recipe.yaml"):
        result = cli("verify", str(target))
        assert result.returncode == 0 and result.stdout.strip() == f"ok: {copy} matches its manifest", result
    compared = cli("compare", str(store / "tiny" / "v0002"), str(copy))
    assert compared.returncode == 0, compared.stderr
    winner = copy / "winner.json"
    winner.chmod(0o644)
    winner.write_text(winner.read_text().replace("onnx", "onnX", 1))
    damaged = cli("verify", str(copy / "recipe.yaml"))
    assert (
        damaged.returncode == 1 and "damaged: " in damaged.stdout and "winner.json: sha256" in damaged.stdout
    )
    assert cli("verify", str(TINY), "v0002", root=store).returncode == 0  # the store's own is untouched


def test_prune_keeps_the_newest_the_promoted_and_latest(tmp_path: Path) -> None:
    """v0001 promoted (the recipe file), v0002 and v0003 candidates, latest on v0001: --keep 1 removes v0002
    only, with the cache entries no kept version holds; --keep 0 removes nothing that is promoted or latest."""
    root = tmp_path / "out"
    assert cli("deploy", str(TINY), root=root).returncode == 0
    for warmup in ("0.11", "0.12"):
        result = cli("deploy", str(TINY), "--set", f"benchmark.warmup_s={warmup}", root=root)
        assert result.returncode == 0 and "candidate:" in result.stdout, result.stderr[-2000:]
    sizes = {v: row["bytes"] for v, row in _list(root).items()}
    assert sorted(sizes) == ["v0001", "v0002", "v0003"] and all(b > 0 for b in sizes.values())
    dry = cli("prune", str(TINY), "--keep", "1", "--dry-run", "--json", root=root)
    assert dry.returncode == 0 and json.loads(dry.stdout)["removed"] == ["v0002"]
    assert sorted(_list(root)) == ["v0001", "v0002", "v0003"]  # a dry run removes nothing
    done = cli("prune", str(TINY), "--keep", "1", "--json", root=root)
    report = json.loads(done.stdout)
    assert report["removed"] == ["v0002"] and report["kept"] == {"v0001": "latest", "v0003": "newest"}
    assert report["freed_bytes"] >= sizes["v0002"]
    assert sorted(_list(root)) == ["v0001", "v0003"] and not list((root / "tiny").glob(".pruned-*"))
    assert cli("prune", str(TINY), "--keep", "0", root=root).returncode == 0
    assert sorted(_list(root)) == ["v0001"]  # latest (and promoted) stays whatever --keep says
    for version in ("v0001",):
        assert cli("verify", str(TINY), version, root=root).returncode == 0
    again = cli(
        "deploy", str(TINY), root=root
    )  # the cache entries it dropped are not needed to be up to date
    assert again.returncode == 0 and again.stdout.strip().endswith("up to date: tiny/v0001")


def test_a_rollback_stays_and_a_failed_candidate_is_never_up_to_date(tmp_path: Path) -> None:
    """promote v0001 after v0002 was latest: the next deploy does not move latest forward again. A candidate
    whose sign-off failed is built again when repeated, never called up to date (exit 1 both times)."""
    root = tmp_path / "out"
    assert cli("deploy", str(TINY), root=root).returncode == 0
    assert cli("deploy", str(TINY), "--rebench", root=root).returncode == 0  # v0002, latest
    assert cli("promote", str(TINY), "v0001", root=root).returncode == 0
    again = cli("deploy", str(TINY), root=root)
    assert again.returncode == 0 and "recovered" not in again.stdout, again.stdout
    assert (root / "tiny" / "latest").readlink() == Path("v0001")
    failing = ["--set", "selection.max_p99_ms=0.000001"]
    first = cli("deploy", str(TINY), *failing, root=root)
    assert first.returncode == 1, first.stdout[-2000:]
    second = cli("deploy", str(TINY), *failing, root=root)
    assert second.returncode == 1 and "up to date" not in second.stdout, second.stdout[-2000:]
