"""The recipe's JSON Schema for editors: committed, in sync with the models, every field described, and
named by the first line of every shipped recipe."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from pipeline.recipe.json_schema import schema_text
from pipeline.runners.registry import runtimes

ROOT = Path(__file__).resolve().parents[2]
SCHEMA = ROOT / "recipes/recipe.schema.json"
SHIPPED = sorted([*(ROOT / "recipes").rglob("*.yaml"), *(ROOT / "tests/recipes").glob("*.yaml")])
PREFIX = "# yaml-language-server: $schema="


def test_committed_schema_is_in_sync() -> None:
    assert SCHEMA.read_text() == schema_text(list(runtimes())), (
        "recipes/recipe.schema.json is stale: python -m pipeline schema --output recipes/recipe.schema.json"
    )


def _properties(node: Any, where: str = "") -> list[tuple[str, dict[str, Any]]]:
    found = []
    if isinstance(node, dict):
        for name, prop in node.get("properties", {}).items():
            found.append((f"{where}.{name}", prop))
        for key, value in node.items():
            found += _properties(value, f"{where}/{key}")
    elif isinstance(node, list):
        for item in node:
            found += _properties(item, where)
    return found


def test_every_field_has_a_description() -> None:
    import json

    props = _properties(json.loads(SCHEMA.read_text()))
    assert len(props) > 100
    assert [where for where, prop in props if not prop.get("description", "").strip()] == []


@pytest.mark.parametrize("recipe", SHIPPED, ids=lambda p: str(p.relative_to(ROOT)))
def test_shipped_recipes_name_the_schema(recipe: Path) -> None:
    first = recipe.read_text().splitlines()[0]
    assert first.startswith(PREFIX), first
    assert (recipe.parent / first[len(PREFIX) :]).resolve() == SCHEMA


def test_schema_command_prints_it() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "pipeline", "schema"], cwd=ROOT, capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0 and out.stdout == SCHEMA.read_text()
