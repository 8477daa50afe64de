"""The recipe's JSON Schema, from the pydantic models (every field carries a description), for editors:
recipes start with `# yaml-language-server: $schema=<path to recipes/recipe.schema.json>`."""

from __future__ import annotations

import json
from typing import Any

from pipeline.recipe import Recipe

DIALECT = "https://json-schema.org/draft/2020-12/schema"


def recipe_schema() -> dict[str, Any]:
    schema = Recipe.model_json_schema(mode="validation")
    return {"$schema": DIALECT, **schema, "title": "deploy-pipeline recipe"}


def schema_text() -> str:
    """The committed file's exact text (a test keeps recipes/recipe.schema.json equal to it)."""
    return json.dumps(recipe_schema(), indent=2) + "\n"
