"""A user's folder as the tests make it: their own module beside their recipe, off the tool's checkout."""

from __future__ import annotations

from pathlib import Path

TINY = Path(__file__).resolve().parent / "recipes" / "tiny.yaml"


def recipe_with_own_module(folder: Path, module: str) -> Path:
    """`folder/<module>.py` re-exporting the tiny encoder (tests.models.tiny, so PYTHONPATH must reach this
    checkout) and `folder/mine.yaml`, the tiny recipe naming `<module>:encoder`."""
    (folder / f"{module}.py").write_text("from tests.models.tiny import encoder\n")
    recipe = folder / "mine.yaml"
    text = TINY.read_text()
    mine = text.replace('"tests.models.tiny:encoder"', f'"{module}:encoder"')
    assert mine != text, "tiny.yaml no longer names tests.models.tiny:encoder"
    recipe.write_text(mine)
    return recipe
