"""Random samples walk every dynamic dim through its range, and two dims not in lockstep: a U-Net whose eager
forward failed at height 18 signed off, because its height and width only ever came as squares."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from pipeline.core.errors import RecipeError
from pipeline.inputs.data import Dataset
from pipeline.inputs.specs import DataSpec
from pipeline.recipe.loader import load
from pipeline.report.inputs import inputs_section

RECIPE = """
name: images
model: {source: entrypoint, entrypoint: "tests.models.tiny:encoder", kwargs: {hidden: 64, layers: 1}, seed: 0}
inputs:
  - {name: pixels, dtype: float32, shape: [batch, 3, height, width], low: 0, high: 1}
dims:
  batch: {min: 1, opt: 2, max: 8}
  height: {min: 16, opt: 32, max: 48}
  width: {min: 16, opt: 32, max: 48}
outputs: [out]
data:
  samples: {source: random, samples: 12}
  calibration: 6
  validation: 6
"""


def test_two_image_dims_come_in_combinations_and_each_covers_its_range(tmp_path: Path) -> None:
    path = tmp_path / "r.yaml"
    path.write_text(RECIPE)
    recipe = load(path).recipe
    dataset = Dataset(DataSpec.from_recipe(recipe, tmp_path))
    shapes = [dataset._random_sample(i)["pixels"].shape for i in range(12)]  # one sample each: (3, h, w)
    heights, widths = {s[1] for s in shapes}, {s[2] for s in shapes}
    assert heights == widths == {16, 24, 32, 40, 48}, shapes
    assert any(h != w for _, h, w in shapes), shapes  # not only squares
    assert sum(h == w for _, h, w in shapes) < len(shapes) / 2, shapes


def test_the_inputs_coverage_names_the_smallest_and_largest_shapes_by_size(tmp_path: Path) -> None:
    """Shapes sorted as tuples put 1×48 before 2×4: the sign-off's Inputs table called 1×48 the smallest."""
    path = tmp_path / "r.yaml"
    path.write_text(RECIPE)
    dataset = Dataset(DataSpec.from_recipe(load(path).recipe, tmp_path))
    feeds = [
        {"pixels": np.zeros(shape, np.float32)} for shape in [(1, 3, 48, 48), (2, 3, 16, 16), (1, 3, 16, 32)]
    ]
    covered = dataset.value_coverage(feeds)["pixels"]
    assert covered["shapes"] == [[1, 3, 16, 32], [1, 3, 48, 48]]
    # each axis's own extremes: the widest batch (2) is in neither of those shapes
    assert covered["dim_ranges"] == [[1, 2], [3, 3], [16, 48], [16, 48]]
    assert inputs_section({"inputs": {"pixels": covered}}).blocks[1].rows[0][2] == "1–2 × 3 × 16–48 × 16–48"


def _with_inputs(tmp_path: Path, *inputs: str) -> Path:
    """RECIPE with these inputs after its pixels."""
    pixels = "low: 0, high: 1}\n"
    path = tmp_path / "r.yaml"
    path.write_text(RECIPE.replace(pixels, pixels + "".join(f"  - {line}\n" for line in inputs), 1))
    return path


def test_a_bool_input_keeps_to_its_range(tmp_path: Path) -> None:
    """low 0, high 0 on a padding mask means no padding: a mask drawn half True anyway had whole rows masked,
    which made the model's FP32 graph compute NaN and its static INT8 calibration fail."""
    path = _with_inputs(
        tmp_path,
        "{name: none, dtype: bool, shape: [batch, 3], low: 0, high: 0}",
        "{name: all, dtype: bool, shape: [batch, 3], low: 1, high: 1}",
        "{name: either, dtype: bool, shape: [batch, 3]}",
    )
    recipe = load(path).recipe
    dataset = Dataset(DataSpec.from_recipe(recipe, tmp_path))
    samples = [dataset._random_sample(i) for i in range(12)]
    assert all(s["none"].dtype == np.bool_ and not s["none"].any() for s in samples)
    assert all(s["all"].all() for s in samples)
    either = np.concatenate([s["either"].ravel() for s in samples])
    assert 0.2 < either.mean() < 0.8


def test_a_bool_range_other_than_0_or_1_is_refused(tmp_path: Path) -> None:
    """high: 0.5 reads like a probability of True; it would be rounded, so it is refused where it is written."""
    path = _with_inputs(tmp_path, "{name: mask, dtype: bool, shape: [batch, 3], high: 0.5}")
    with pytest.raises(RecipeError) as refused:
        load(path)
    assert "inputs[1].high: must be 0 (False) or 1 (True) for a bool input (got 0.5)" in str(refused.value)


ITEMS = """
name: items
model: {source: entrypoint, entrypoint: "tests.models.tiny:top_items", seed: 0}
inputs:
  - {name: items, dtype: float32, shape: [batch, items, 6], low: -1, high: 1}
dims:
  batch: {min: 1, opt: 2, max: 8}
  items: {min: 3, opt: 10, max: 20}
outputs: [top, scores]
data:
  samples: {source: random, samples: 16}
  calibration: 8
  validation: 8
"""


def _items(tmp_path: Path) -> tuple[Dataset, object]:
    path = tmp_path / "items.yaml"
    path.write_text(ITEMS)
    recipe = load(path).recipe
    return Dataset(DataSpec.from_recipe(recipe, tmp_path)), recipe


def test_a_random_sample_fitted_to_a_longer_shape_is_extended_with_random_values(tmp_path: Path) -> None:
    """Samples of 3 to 19 items checked at 20 were padded with rows of zeros, which score alike: a top-k
    model's FP32 ONNX graph broke the ties in another order than eager and failed validation (top_items
    max_abs 5 > 0). The filler is drawn as the sample was, reproducibly; the sample's own rows are kept."""
    dataset, _ = _items(tmp_path)
    feeds = dataset.corner_feeds("max", 8)["items"]
    assert feeds.shape == (8, 20, 6)
    for row, i in zip(feeds, dataset.validation_index, strict=False):
        own = dataset.items[i]["items"]
        assert np.array_equal(row[: len(own)], own)
        assert len({tuple(r) for r in row.round(6)}) == 20  # no two items alike
        assert row.min() >= -1 and row.max() <= 1
    assert np.array_equal(feeds, dataset.corner_feeds("max", 8)["items"])


def test_the_padding_mask_of_random_samples_still_marks_the_filler_as_padding() -> None:
    """The tiny recipe's random token ids at the longest corner: the ids' filler is drawn, the mask's is
    padding, so per-token checks still see padded positions there."""
    tiny = Path(__file__).resolve().parents[1] / "recipes" / "tiny.yaml"
    dataset = Dataset(DataSpec.from_recipe(load(tiny).recipe, tiny.parent))
    feeds = dataset.corner_feeds("max", 8)
    padded = feeds["attention_mask"] == 0
    assert padded.any() and (feeds["input_ids"][padded] >= 1).all()


def test_a_top_k_graph_agrees_with_eager_at_the_longest_corner(tmp_path: Path) -> None:
    """The failure end to end, on a real ONNX Runtime session: at the max corner every sample shorter than 20
    items used to end in tied zero rows."""
    import onnxruntime as ort
    import torch

    from pipeline.inputs.models import load_model
    from pipeline.inputs.specs import ModelSpec

    dataset, recipe = _items(tmp_path)
    model = load_model(ModelSpec.from_recipe(recipe, tmp_path)).module.eval()
    feeds = dataset.corner_feeds("max", 8)["items"]
    path = tmp_path / "top.onnx"
    torch.onnx.export(
        model,
        (torch.from_numpy(feeds),),
        str(path),
        dynamo=False,
        input_names=["items"],
        output_names=["top", "scores"],
        dynamic_axes={"items": {0: "batch", 1: "items"}},
    )
    (got, _) = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(None, {"items": feeds})
    with torch.no_grad():
        want = model(torch.from_numpy(feeds))[0].numpy()
    assert np.array_equal(got, want)
