"""Pre-flight: what the machine and the files must provide, found before any work."""

from __future__ import annotations

from pathlib import Path

import pytest

from pipeline.core.errors import RecipeError
from pipeline.preflight import checks as preflight
from pipeline.recipe.loader import load

ROOT = Path(__file__).resolve().parents[2]


def _problems(recipe: str, *overrides: str) -> list[str]:
    with pytest.raises(RecipeError) as info:
        preflight.check(load(ROOT / recipe, overrides))
    return info.value.lines()


def test_shipped_recipes_pass() -> None:
    for recipe in ("recipes/bert.yaml", "tests/recipes/tiny.yaml"):
        preflight.check(load(ROOT / recipe))


def test_entrypoint_factory_must_exist() -> None:
    assert _problems("tests/recipes/tiny.yaml", "model.entrypoint=tests.models.tiny:nope") == [
        "--set model.entrypoint=tests.models.tiny:nope: model.entrypoint: module 'tests.models.tiny' has no callable 'nope'"
    ]


def test_text_field_must_exist_in_the_samples() -> None:
    [line] = _problems("recipes/bert.yaml", "data.samples.field=sentence")
    assert "data.samples.field" in line and "has no field 'sentence' (it has text)" in line


def test_npz_must_hold_every_input(tmp_path: Path) -> None:
    import numpy as np

    np.savez(tmp_path / "d.npz", input_ids=np.ones((4, 16), dtype=np.int64))
    [line] = _problems("tests/recipes/tiny.yaml", f"data.samples={{source: npz, path: {tmp_path / 'd.npz'}}}")
    assert "has no array for input(s) attention_mask" in line


def test_a_listed_cpu_runtime_must_be_installed(monkeypatch: pytest.MonkeyPatch) -> None:
    import sys

    monkeypatch.setitem(sys.modules, "openvino", None)  # as if openvino were not installed
    [line] = _problems("tests/recipes/tiny.yaml", "benchmark.runtimes=[onnxruntime-cpu, openvino-cpu]")
    assert "benchmark.runtimes[1]: openvino-cpu needs openvino, which is not installed" in line
    assert "pip install 'deploy-pipeline[openvino]'" in line


def test_an_unknown_runtime_is_a_located_recipe_error() -> None:
    [line] = _problems("tests/recipes/tiny.yaml", "benchmark.runtimes=[onnxruntime-gpu]")
    assert (
        "benchmark.runtimes[0]: unknown runtime 'onnxruntime-gpu': did you mean 'onnxruntime-cpu'? (known: "
        in line
        and "openvino-cpu" in line
    )


PAIRS = """name: pairs
model: {source: entrypoint, entrypoint: "tests.models.tiny:pair_logits", seed: 0}
inputs:
  - {name: x, dtype: float32, shape: [batch, sequence, 8]}
dims:
  batch: {min: 1, opt: 4, max: 8}
  sequence: {min: 2, opt: 4, max: 6}
outputs: [logits, score]
data:
  samples: {source: random, samples: 16}
  calibration: 4
  validation: 8
variants:
  build: [onnx-fp32]
"""


def _pairs(tmp_path: Path, **replace: str) -> Path:
    recipe = tmp_path / "pairs.yaml"
    text = PAIRS
    for old, new in replace.items():
        text = text.replace(old, new)
    recipe.write_text(text)
    return recipe


def test_an_output_of_batch_by_batch_is_not_one_value_per_sample(tmp_path: Path) -> None:
    """At a batch of 1 a similarity [batch, batch] is one value, as a score [batch, 1] is: pre-flight also runs
    the model at a batch of 2, and no later run at a batch of 1 (the sequence's max) makes it one value again,
    so `validate`'s gates follow the kinds the deploy gates by."""
    recipe = _pairs(tmp_path)
    assert preflight.check(load(recipe)) == {"logits": "values", "score": "one value per sample"}
    # a validation that never runs a batch of 2 sees one value, as the deploy's gates then do
    single = [
        "validation.corner_batches={min: 1, opt: 1, max: 1}",
        "validation.data_batch=1",
        "benchmark.batch_sizes=[1]",
    ]
    assert preflight.check(load(recipe, single))["logits"] == "one value per sample"
    # the benchmark's largest batch is validated too (input set 'timed'): at 2 it is what it is at 2
    timed = [*single[:2], "benchmark.batch_sizes=[1, 2]"]
    assert preflight.check(load(recipe, timed))["logits"] == "values"
    fixed = ["dims.batch.max=1", "dims.batch.opt=1", "benchmark.batch_sizes=[1]", single[0]]
    assert preflight.check(load(recipe, fixed))["logits"] == "one value per sample"


def test_the_off_corner_run_of_stored_samples_counts_as_a_validated_batch(tmp_path: Path) -> None:
    """Stored samples are also validated at a shape between the corners, at the opt corner's batch even where
    that corner is not checked: a batch of 2 there makes the similarity what it is at 2, not one value."""
    import numpy as np

    data = tmp_path / "x.npz"
    np.savez(data, x=np.random.default_rng(0).standard_normal((16, 6, 8)).astype(np.float32))
    recipe = _pairs(tmp_path)
    stored = [
        f"data.samples={{source: npz, path: {data}}}",
        "validation.corners=[min, max]",
        "validation.corner_batches={min: 1, opt: 2, max: 1}",
        "validation.data_batch=1",
        "benchmark.batch_sizes=[1]",
    ]
    assert preflight.check(load(recipe, stored))["logits"] == "values"
    # the same recipe on random samples has no off-corner run: every batch validated is 1
    assert preflight.check(load(recipe, stored[1:]))["logits"] == "one value per sample"
    # nor do stored samples whose only dynamic dim besides the batch has no size between its corners
    fixed_length = [*stored, "dims.sequence={min: 6, opt: 6, max: 6}"]
    assert preflight.check(load(recipe, fixed_length))["logits"] == "one value per sample"


def test_the_run_at_a_batch_of_two_is_checked_as_every_other_run(tmp_path: Path) -> None:
    """An output that is NaN at a batch of 1 only (standardized over the batch) is not refused as NaN
    everywhere; outputs whose rank changes at a batch of 2 are a located error, not an internal one."""
    standardized = _pairs(tmp_path, pair_logits="batch_standardized", **{"[logits, score]": "[z, h]"})
    assert preflight.check(load(standardized))["z"] == "values"
    squeezed = _pairs(tmp_path, pair_logits="squeezed_at_two", **{"[logits, score]": "[score, pooled]"})
    with pytest.raises(RecipeError) as info:
        preflight.check(load(squeezed))
    [line] = info.value.lines()
    assert "dims.batch.max" in line and "the model's outputs (or their ranks) change when batch = 2" in line


def test_a_module_beside_the_recipe_but_off_the_import_path_says_where_to_run_from(tmp_path: Path) -> None:
    (tmp_path / "my_model_beside.py").write_text("def build():\n    raise AssertionError('not imported')\n")
    recipe = _pairs(tmp_path, **{"tests.models.tiny:pair_logits": "my_model_beside:build"})
    with pytest.raises(RecipeError) as info:
        preflight.check(load(recipe))
    [line] = info.value.lines()
    assert (
        "model.entrypoint: cannot import module 'my_model_beside': it is in the recipe's folder, which is "
        in line
    )
    assert f"run `python -m pipeline` from {tmp_path.resolve()}, or add that folder to PYTHONPATH" in line
    elsewhere = _pairs(tmp_path, **{"tests.models.tiny:pair_logits": "no_such_module_here:build"})
    with pytest.raises(RecipeError) as info:
        preflight.check(load(elsewhere))
    assert (
        "cannot import module 'no_such_module_here': it is not on Python's import path"
        in info.value.lines()[0]
    )
    # a package that imports, without the submodule named: Python's own message, no advice about the path
    missing = _pairs(tmp_path, **{"tests.models.tiny:pair_logits": "tests.models.no_such_submodule:build"})
    with pytest.raises(RecipeError) as info:
        preflight.check(load(missing))
    [line] = info.value.lines()
    assert "importing 'tests.models.no_such_submodule' failed: ModuleNotFoundError" in line
    assert "import path" not in line
