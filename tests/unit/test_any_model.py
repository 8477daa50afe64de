"""What a model nobody tuned for needs before any export: inputs bound to forward's parameters by name, every
source's random initialisation seeded, integer random inputs with a real range, tolerances merged into the
defaults key by key, and INT8 patterns that match the model."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from pipeline.core.errors import RecipeError
from pipeline.inputs.models import BindingError, load_model
from pipeline.inputs.specs import ModelSpec
from pipeline.preflight import checks as preflight
from pipeline.recipe.loader import load
from pipeline.release.manifest import resolved_recipe

ROOT = Path(__file__).resolve().parents[2]
ZOO = ROOT / "tests" / "zoo" / "recipes"
TINY = ROOT / "tests" / "recipes" / "tiny.yaml"


def _spec(recipe: Path, *overrides: str) -> ModelSpec:
    return ModelSpec.from_recipe(load(recipe, list(overrides)).recipe, recipe.parent)


def _problems(recipe: Path, *overrides: str) -> list[str]:
    with pytest.raises(RecipeError) as info:
        preflight.check(load(recipe, list(overrides)))
    return info.value.lines()


# ---------------------------------------------------------------- binding by name


def test_inputs_reach_forward_by_name_whatever_their_order() -> None:
    """The recipe lists tokens first; forward takes features first. Positionally the token ids would reach
    the linear layer (the old failure: 'Expected tensor for argument #1 indices to have ... Long')."""
    model = load_model(_spec(ZOO / "two-dtypes.yaml"))
    tokens, features = torch.randint(0, 255, (2, 8)), torch.randn(2, 8)
    (logits,) = model.module(tokens, features)
    with torch.no_grad():
        assert torch.equal(logits, model.module.inner(features=features, tokens=tokens))


def test_a_forward_taking_only_keywords_gets_the_inputs_by_name() -> None:
    """A hold-out's `forward(self, **inputs)` failed pre-flight: "takes 1 positional argument but 3 were given"."""
    model = load_model(_spec(TINY, "model.entrypoint=tests.models.tiny:keywords_only"))
    ids, mask = torch.randint(1, 999, (2, 8)), torch.ones(2, 8, dtype=torch.long)
    mask[1, 5:] = 0
    with torch.no_grad():
        hidden, pooled = model.module(ids, mask)
        want = model.module.inner(attention_mask=mask, input_ids=ids)
    assert torch.equal(hidden, want[0]) and torch.equal(pooled, want[1])
    preflight.check(load(TINY, ["model.entrypoint=tests.models.tiny:keywords_only"]))


def test_a_huggingface_model_whose_second_parameter_is_not_the_second_input() -> None:
    """GPT2LMHeadModel.forward(input_ids, past_key_values/cache, attention_mask, ...): the mask is bound to
    attention_mask, not to the cache slot (the old failure: 'Tensor' object has no attribute
    'get_seq_length')."""
    preflight.check(load(ZOO / "gpt2.yaml"))


def test_an_input_that_is_no_parameter_is_a_located_error() -> None:
    with pytest.raises(BindingError) as info:
        load_model(_spec(ZOO / "two-dtypes.yaml", "inputs[1].name=dense"))
    assert info.value.key == "inputs[1].name"
    assert "'dense' is not a parameter of TokensAndFeatures.forward(features, tokens)" in str(info.value)
    [line] = _problems(ZOO / "two-dtypes.yaml", "inputs[1].name=dense")
    assert "inputs[1].name: 'dense' is not a parameter" in line


def test_dict_outputs_are_picked_by_name() -> None:
    """The model returns hidden, logits and probabilities; the recipe deploys logits and hidden, in its order."""
    model = load_model(_spec(ZOO / "dict-output.yaml"))
    x = torch.randn(3, 16)
    logits, hidden = model.module(x)
    raw = model.module.inner(x)
    assert torch.equal(logits, raw["logits"]) and torch.equal(hidden, raw["hidden"])


def test_a_missing_dict_output_is_a_located_error() -> None:
    [line] = _problems(ZOO / "dict-output.yaml", "outputs=[logits, scores]")
    assert "outputs[1]: the model has no output 'scores' (it returns hidden, logits, probabilities)" in line


# ---------------------------------------------------------------- one model in every process


def test_every_process_builds_the_same_weights() -> None:
    """A factory that draws its weights from torch's global generator (every transformers model does) builds
    the same weights in another process, as the GPU host's lane worker does; the digest says so."""
    spec = _spec(ZOO / "bert.yaml")
    here = load_model(spec).weights_digest()
    assert load_model(spec).weights_digest() == here
    code = (
        "from pathlib import Path; from pipeline.recipe.loader import load; from pipeline.inputs.specs import ModelSpec;"
        "from pipeline.inputs.models import load_model;"
        f"p = Path({str(ZOO / 'bert.yaml')!r}); r = load(p).recipe;"
        "print(load_model(ModelSpec.from_recipe(r, p.parent)).weights_digest())"
    )
    torch.manual_seed(1234)  # the caller's random state does not leak into the model's
    other = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True)
    assert other.stdout.strip() == here
    assert load_model(_spec(ZOO / "bert.yaml", "model.seed=1")).weights_digest() != here


def test_a_factory_built_transformers_model_traces_without_transformers_notes() -> None:
    """torch.jit.trace reads every attribute of the model: transformers' `loss_function` property then warned of
    an unrecognized `loss_type` on the console of every deploy of a model a factory built from a config. In a
    process of its own, since transformers warns once per process."""
    code = (
        "from pathlib import Path; import torch; from pipeline.recipe.loader import load;"
        "from pipeline.inputs.specs import ModelSpec; from pipeline.inputs.models import load_model;"
        f"p = Path({str(ZOO / 'bert.yaml')!r}); r = load(p).recipe;"
        "m = load_model(ModelSpec.from_recipe(r, p.parent)).module;"
        "ids = torch.ones(1, 8, dtype=torch.long);"
        "torch.jit.trace(m, tuple(ids for _ in r.inputs), check_trace=False); print('traced')"
    )
    run = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True)
    assert run.stdout.strip() == "traced"
    assert "loss_type" not in run.stderr, run.stderr


def test_seeding_leaves_the_callers_random_state_alone() -> None:
    torch.manual_seed(7)
    np.random.seed(7)
    expected = torch.rand(3), np.random.rand(3)
    torch.manual_seed(7)
    np.random.seed(7)
    load_model(_spec(ZOO / "resnet.yaml"))
    assert torch.equal(torch.rand(3), expected[0]) and np.array_equal(np.random.rand(3), expected[1])


# ---------------------------------------------------------------- data ranges


def test_random_integer_inputs_need_their_range(tmp_path: Path) -> None:
    """Drawn from the float default 0..1, token ids were all 0 or 1 and the model was validated and
    calibrated on two embedding rows."""
    text = TINY.read_text().replace(", low: 1, high: 999}", "}")
    path = tmp_path / "tiny.yaml"
    path.write_text(text)
    with pytest.raises(RecipeError) as info:
        load(path)
    [line] = info.value.lines()
    assert ":6:5: inputs[0]: an integer input of random samples needs low and high" in line


def test_a_huggingface_source_fills_its_token_ranges_from_its_vocabulary() -> None:
    from pipeline.inputs.data import value_range
    from pipeline.recipe import InputSpec

    config = {"vocab_size": 30522, "type_vocab_size": 2}
    spec = {"dtype": "int64", "shape": ["batch", "sequence"]}
    assert value_range(InputSpec(name="input_ids", **spec), config) == (0, 30521)
    assert value_range(InputSpec(name="attention_mask", **spec), config) == (1, 1)
    assert value_range(InputSpec(name="token_type_ids", **spec), config) == (0, 1)
    assert value_range(InputSpec(name="pixels", dtype="float32", shape=[3])) == (0, 1)
    recipe = load(ROOT / "recipes" / "bert.yaml", ["data.samples={source: random}"])
    assert recipe.recipe.inputs[0].low is None  # allowed: the model's vocabulary fills it


# ---------------------------------------------------------------- gates


def test_a_partial_tolerance_override_keeps_the_other_gates() -> None:
    """--set validation.tolerances.fp32.max_abs=1e-9 used to resolve fp32 to cosine None (the gate gone) and
    leave every other precision out of the resolved recipe."""
    loaded = load(TINY, ["validation.tolerances.fp32.max_abs=1e-9"])
    fp32 = loaded.recipe.validation.tolerances["fp32"]
    assert (fp32.max_abs, fp32.cosine) == (1e-9, 0.9999)
    resolved = resolved_recipe(loaded)["validation"]["tolerances"]
    assert set(resolved) == {"fp32", "fp16", "int8", "bf16", "fp8"}
    assert resolved["int8"]["cosine"] == 0.98 and resolved["fp16"]["informational"] == ["max_abs"]


def test_a_threshold_the_recipe_writes_gates_and_null_drops_a_gate() -> None:
    loaded = load(TINY, ["validation.tolerances.fp16.max_abs=0.01", "validation.tolerances.fp32.cosine=null"])
    tolerances = loaded.recipe.validation.tolerances
    assert tolerances["fp16"].informational == [] and tolerances["fp16"].cosine == 0.999
    assert tolerances["fp32"].cosine is None and tolerances["fp32"].max_abs == 1e-3


def test_validate_prints_the_effective_gates() -> None:
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "pipeline",
            "validate",
            str(TINY),
            "--set",
            "validation.tolerances.fp32.max_abs=1e-9",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    assert result.returncode == 0, result.stderr
    fp32 = next(line for line in result.stdout.splitlines() if "│ fp32" in line and "hidden" in line)
    assert "max_abs ≤ 1e-09 × scale" in fp32 and "cosine ≥ 0.9999" in fp32


# ---------------------------------------------------------------- INT8 patterns


def test_an_int8_pattern_that_matches_no_module_is_a_located_error() -> None:
    lines = _problems(ZOO / "resnet.yaml", 'export.int8.exclude=["*.conv1", "*.intermediate.dense"]')
    assert lines == [
        '--set export.int8.exclude=["*.conv1", "*.intermediate.dense"]: export.int8.exclude[1]: '
        "'*.intermediate.dense' matches no module of the model (module paths read like: inner.conv1, inner.bn1, "
        "inner.relu)"
    ]


# ---------------------------------------------------------------- torchvision


def _with_torchvision(stand_in: str, *args: str) -> subprocess.CompletedProcess[str]:
    env = {"PYTHONPATH": f"{ROOT / 'tests' / 'models' / stand_in}:{ROOT}", "PATH": "/usr/bin:/bin"}
    return subprocess.run([sys.executable, *args], cwd=ROOT, capture_output=True, text=True, env=env)


DIGEST = (
    "from pathlib import Path; from pipeline.recipe.loader import load; from pipeline.inputs.specs import ModelSpec;"
    "from pipeline.inputs.models import load_model;"
    f"p = Path({str(ZOO / 'resnet.yaml')!r});"
    "r = load(p, ['model={source: torchvision, name: resnet}']).recipe;"
    "print(load_model(ModelSpec.from_recipe(r, p.parent)).weights_digest())"
)


def test_a_random_init_torchvision_model_is_the_same_model_in_every_process() -> None:
    """ResNet-50 on the H200 was exported from other random weights than the reference: the lane worker built
    the unseeded torchvision model again."""
    first = _with_torchvision("torchvision_like", "-c", DIGEST)
    second = _with_torchvision("torchvision_like", "-c", "import torch; torch.rand(5);" + DIGEST)
    assert first.returncode == 0, first.stderr[-2000:]
    assert first.stdout.strip() == second.stdout.strip() != ""


def test_a_torchvision_for_another_torch_says_what_to_install() -> None:
    result = _with_torchvision(
        "torchvision_mismatched",
        "-m",
        "pipeline",
        "validate",
        str(ZOO / "resnet.yaml"),
        "--set",
        "model={source: torchvision, name: resnet50}",
    )
    assert result.returncode == 2, result.stderr[-2000:]
    [line] = result.stderr.strip().splitlines()
    assert "model.name: torchvision does not match torch 2." in line
    assert "(operator torchvision::nms does not exist)" in line
    assert (
        "pip install 'torchvision==0." in line and "--index-url https://download.pytorch.org/whl/cpu" in line
    )


def test_pre_flight_runs_the_model_on_the_recipes_own_samples(tmp_path: Path) -> None:
    """The deploy feeds a recipe with samples nothing but those samples (cropped or padded to each shape), so
    pre-flight judges the model on them: boxes drawn in a value range have corners out of order, an index below
    zero for a layout model whose stored boxes are fine. A recipe of random samples is judged on random ones."""
    rng = np.random.default_rng(0)
    corner = rng.integers(0, 30, (20, 12, 2))
    boxes = np.concatenate([corner, corner + rng.integers(0, 30, (20, 12, 2))], -1)
    np.savez(tmp_path / "boxes.npz", input_ids=rng.integers(0, 100, (20, 12)), boxes=boxes)
    recipe = tmp_path / "boxes.yaml"
    recipe.write_text(
        """
name: boxes
model: {source: entrypoint, entrypoint: "tests.models.tiny:box_layout"}
inputs:
  - {name: input_ids, dtype: int64, shape: [batch, sequence], low: 0, high: 99}
  - {name: boxes, dtype: int64, shape: [batch, sequence, 4], low: 0, high: 59}
dims:
  batch: {min: 1, opt: 2, max: 4}
  sequence: {min: 4, opt: 8, max: 12}
outputs: [hidden]
data:
  samples: {source: npz, path: boxes.npz}
  calibration: 8
  validation: 8
variants:
  build: [onnx-fp32]
benchmark:
  batch_sizes: [1, 2]
"""
    )
    preflight.check(load(recipe))  # raises on a problem
    [line] = _problems(recipe, "data.samples={source: random}")
    assert "model: the model fails at the min shape (input_ids [1, 4], boxes [1, 4, 4]): IndexError" in line


def test_pre_flight_probes_a_dim_the_samples_do_not_follow_on_synthetic_inputs(tmp_path: Path) -> None:
    """Text is tokenized to the sequence dim only (benchmark.sequence_dim): a length dim under another name is
    not one the samples can be made at, so its max is probed on synthetic inputs, not at the sentences' own
    lengths (which would probe neither the position table nor the memory at the max)."""
    from pipeline.inputs.models import load_model
    from pipeline.preflight.probe_inputs import SAMPLES, SYNTHETIC, ProbeInputs

    text = (ROOT / "recipes/bert.yaml").read_text().replace("[batch, sequence]", "[batch, length]")
    text = text.replace("  sequence: {min: 8, opt: 128, max: 256}", "  length: {min: 8, opt: 128, max: 256}")
    text = text.replace("sequence_lengths: [128]", "sequence_lengths: []")
    text = text.replace(
        "  padding: {mask_input: attention_mask, per_token_outputs: [last_hidden_state]}\n", ""
    )
    text = text.replace("    - onnx-packed-fp32", "    # -").replace("    - aoti-packed-fp16", "    # -")
    (tmp_path / "data").symlink_to(ROOT / "recipes/data")
    recipe_path = tmp_path / "renamed.yaml"
    recipe_path.write_text(text)
    recipe = load(recipe_path).recipe
    model = load_model(ModelSpec.from_recipe(recipe, tmp_path))
    probe = ProbeInputs(recipe, tmp_path, model.tokenizer, model.config, samples=True)
    feeds, fed = probe.at({"batch": 2, "length": 256})
    assert fed == SYNTHETIC and feeds["input_ids"].shape == (2, 256)
    shipped = load(ROOT / "recipes/bert.yaml").recipe
    probe = ProbeInputs(shipped, ROOT / "recipes", model.tokenizer, model.config, samples=True)
    feeds, fed = probe.at({"batch": 2, "sequence": 256})
    assert fed == SAMPLES and feeds["input_ids"].shape == (2, 256)
