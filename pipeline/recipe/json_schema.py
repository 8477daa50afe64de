"""The recipe's JSON Schema, from the pydantic models (every field carries a description), for editors:
recipes start with `# yaml-language-server: $schema=<path to recipes/recipe.schema.json>`."""

from __future__ import annotations

import json
from typing import Any

from pipeline.recipe import Recipe
from pipeline.recipe.base import RUNTIME_MARK

DIALECT = "https://json-schema.org/draft/2020-12/schema"


def recipe_schema(runtimes: list[str]) -> dict[str, Any]:
    """The schema, with `runtimes` (the installed runner modules' runtime names) as the enum of every field
    that names a runtime."""
    schema = Recipe.model_json_schema(mode="validation")
    return {"$schema": DIALECT, **_with_runtimes(schema, runtimes), "title": "deploy-pipeline recipe"}


def _with_runtimes(node: Any, runtimes: list[str]) -> Any:
    if isinstance(node, dict):
        if node.get(RUNTIME_MARK):
            return {k: v for k, v in node.items() if k not in (RUNTIME_MARK, "maxLength", "minLength")} | {
                "enum": runtimes
            }
        return {k: _with_runtimes(v, runtimes) for k, v in node.items()}
    if isinstance(node, list):
        return [_with_runtimes(v, runtimes) for v in node]
    return node


def schema_text(runtimes: list[str]) -> str:
    """The committed file's exact text (a test keeps recipes/recipe.schema.json equal to it)."""
    return json.dumps(recipe_schema(runtimes), indent=2) + "\n"
