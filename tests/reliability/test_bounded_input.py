"""Hostile input that costs time or memory rather than being plainly wrong: YAML alias bombs and deep nesting,
infinite or huge numbers, FIFOs and devices as recipes, names past what a file system takes, a store inside
the code. Each is a user error (exit 2) on one located line, found before anything grows or runs: the CLI
runs in a child process with a deadline, and where the input is a memory bomb, with a cap on its memory, so
that a regression fails here instead of taking the machine down."""

from __future__ import annotations

import os
import resource
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from pipeline.core.errors import RecipeError
from pipeline.recipe.loader import load
from tests.reliability.conftest import FAST, ROOT, TINY, Result, sets

DEADLINE_S = 60
LOADER_MEMORY = 1 << 30  # the loader never imports torch: a GiB of address space is ample
# the CLI with torch unimportable: a command that imports it before its recipe is refused dies of that
WITHOUT_TORCH = "import sys; sys.modules['torch'] = None; from pipeline.cli import main; sys.exit(main())"


def run(*args: str, loader_only: bool = False) -> Result:
    """`python -m pipeline ...` from the repository, within DEADLINE_S; loader_only: the answer must come from
    the recipe's loader alone, in LOADER_MEMORY bytes of address space and without torch."""

    def cap() -> None:
        if loader_only:
            resource.setrlimit(resource.RLIMIT_AS, (LOADER_MEMORY, LOADER_MEMORY))

    done = subprocess.run(
        [sys.executable, *(("-c", WITHOUT_TORCH) if loader_only else ("-m", "pipeline")), *args],
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        capture_output=True,
        text=True,
        timeout=DEADLINE_S,
        preexec_fn=cap,
    )
    return Result(done.returncode, done.stdout, done.stderr)


def one_line(result: Result) -> str:
    """The single stderr line of a user error."""
    lines = result.stderr.splitlines()
    assert result.returncode == 2 and len(lines) == 1, (result.returncode, result.stderr[-3000:])
    return lines[0]


def place(text: str, offset: int) -> str:
    """`line:col` (1-based) of a character offset."""
    before = text[:offset]
    return f"{before.count(chr(10)) + 1}:{offset - before.rfind(chr(10))}"


def alias_bomb(levels: int) -> list[str]:
    """The billion-laughs shape, one `key: value` per level: each list holds nine aliases of the one before."""
    lines, previous = ["a: &a [x, x, x, x, x, x, x, x, x]"], "a"
    for name in "bcdefghijklmnop"[: levels - 1]:
        lines.append(f"{name}: &{name} [{', '.join([f'*{previous}'] * 9)}]")
        previous = name
    return lines


# ---------------------------------------------------------------- YAML: aliases and nesting


@pytest.mark.parametrize("command", ["validate", "plan", "deploy"])
def test_alias_bomb_is_refused_before_it_expands(tmp_path: Path, command: str) -> None:
    recipe = tmp_path / "bomb.yaml"
    text = TINY.read_text() + "\n".join(alias_bomb(9)) + "\n"  # 9**9 nodes once expanded
    recipe.write_text(text)
    line = one_line(run(command, str(recipe), *sets(f"output.root={tmp_path}/out"), loader_only=True))
    # b's nine aliases of a add 90 nodes and b stands for 91: the fifth *b of c brings the total past 500
    fifth = text.index("\nc: ") + 1 + len("c: &c [") + 4 * len("*b, ")
    assert line == (
        f"{recipe}:{place(text, fifth)}: c[4]: aliases expand to more than 500 nodes (*b alone is 91); "
        "write the data out instead of nesting aliases"
    )
    assert not (tmp_path / "out").exists()


def test_recursive_alias_is_one_located_line(tmp_path: Path) -> None:
    recipe = tmp_path / "r.yaml"
    text = TINY.read_text().replace("kwargs: {hidden: 64, layers: 2}", "kwargs: &k {hidden: 64, self: *k}")
    recipe.write_text(text)
    line = one_line(run("validate", str(recipe), loader_only=True))
    assert line == (
        f"{recipe}:{place(text, text.index('*k}'))}: model.kwargs.self: alias *k refers to a node that holds it "
        "(a recursive alias); a recipe is a tree"
    )


@pytest.mark.parametrize(
    "value, message",
    [
        ("{" + ", ".join(alias_bomb(4)) + "}", "aliases expand to more than 500 nodes"),
        ("&k {self: *k}", "alias *k refers to a node that holds it (a recursive alias)"),
    ],
    ids=["bomb", "recursive"],
)
def test_aliases_in_an_override_are_bounded_too(value: str, message: str) -> None:
    override = f"model.kwargs={value}"
    line = one_line(run("validate", str(TINY), *sets(override), loader_only=True))
    assert line.startswith(f"--set {override}: model.kwargs: {message}")


def test_deep_nesting_is_refused(tmp_path: Path) -> None:
    recipe = tmp_path / "deep.yaml"
    recipe.write_text(TINY.read_text() + "deep: " + "[" * 5000 + "]" * 5000 + "\n")
    line = one_line(run("validate", str(recipe), loader_only=True))
    assert line.startswith(f"{recipe}:") and line.endswith(": nested deeper than 64 levels")
    assert ": deep[0][0]" in line


# ---------------------------------------------------------------- numbers: finite, and bounded


NUMBERS = [
    ("dims.sequence.max=1000000000", "dims.sequence.max: must be <= 4194304 (got 1000000000)"),
    ("data.samples.samples=1000000000000", "data.samples.samples: must be <= 100000 (got 1000000000000)"),
    ("benchmark.warmup_s=.inf", "benchmark.warmup_s: must be a finite number (got inf)"),
    ("benchmark.min_s=.inf", "benchmark.min_s: must be a finite number (got inf)"),
    ("benchmark.max_s=.inf", "benchmark.max_s: must be a finite number (got inf)"),
    ("benchmark.window_s=1000", "benchmark.window_s: must be <= 600.0 (got 1000)"),
    ("benchmark.batch_sizes=[1, 100000]", "benchmark.batch_sizes[1]: must be <= 65536 (got 100000)"),
    (
        "validation.tolerances.fp32.max_abs=.inf",
        "validation.tolerances.fp32.max_abs: must be a finite number (got inf)",
    ),
    (
        "validation.tolerances.fp16.cosine=.nan",
        "validation.tolerances.fp16.cosine: must be a finite number (got nan)",
    ),
    (
        "export.tensorrt.build_timeout_s=10000000",
        "export.tensorrt.build_timeout_s: must be <= 86400 (got 10000000)",
    ),
    ("output.lock_timeout_s=.inf", "output.lock_timeout_s: must be a finite number (got inf)"),
    ("data.seed=99999999999", "data.seed: must be <= 4294967295 (got 99999999999)"),
    ("model.kwargs.hidden=.inf", "model.kwargs.hidden: must be a finite number (got inf)"),
    ("model.kwargs.sizes=[1, .nan]", "model.kwargs.sizes: holds a number that is not finite at [1]"),
]


@pytest.mark.parametrize("override, expect", NUMBERS, ids=[n[0].split("=")[0] for n in NUMBERS])
def test_numbers_are_finite_and_bounded(override: str, expect: str) -> None:
    with pytest.raises(RecipeError) as info:
        load(TINY, [override])
    assert info.value.lines() == [f"--set {override}: {expect}"]


def test_sizes_are_bounded_in_product() -> None:
    """Each dim within its bound, but an input at its largest shape past what one tensor holds."""
    with pytest.raises(RecipeError) as info:
        load(TINY, ["dims.batch.max=1000", "dims.sequence.max=4000000"])
    assert info.value.lines()[0].endswith(
        "inputs[0].shape: holds 4000000000 elements with every dim at its max; one tensor holds at most 2147483647"
    )


def _numeric(node: Any, where: str = "") -> Iterator[tuple[str, dict[str, Any]]]:
    if isinstance(node, dict):
        if node.get("type") in ("integer", "number"):
            yield where, node
        for key, value in node.items():
            yield from _numeric(value, f"{where}/{key}")
    elif isinstance(node, list):
        for i, item in enumerate(node):
            yield from _numeric(item, f"{where}/{i}")


def test_every_number_of_the_schema_has_a_finite_range() -> None:
    """The mechanism behind the table above, for every field there is and will be: a lower and an upper bound
    in the recipe's JSON Schema, and no inf or nan in any model."""
    from pipeline.recipe import Strict
    from pipeline.recipe.json_schema import recipe_schema

    numbers = list(_numeric(recipe_schema([])))
    assert len(numbers) > 40
    unbounded = [
        where
        for where, node in numbers
        if not (
            {"minimum", "exclusiveMinimum"} & node.keys() and {"maximum", "exclusiveMaximum"} & node.keys()
        )
    ]
    assert unbounded == []
    assert Strict.model_config.get("allow_inf_nan") is False


@pytest.mark.parametrize(
    "override",
    [
        "benchmark.warmup_s=.inf",
        "benchmark.min_s=.inf",
        "benchmark.max_s=.inf",
        "data.samples.samples=1000000000000",
        "dims.sequence.max=1000000000",
        "validation.tolerances.fp32.max_abs=.inf",
        f"name={'n' * 300}",
    ],
    ids=lambda o: o.split("=")[0],
)
def test_deploy_refuses_them_before_any_work(tmp_path: Path, override: str) -> None:
    root = tmp_path / "out"
    result = run("deploy", str(TINY), *sets(*FAST, f"output.root={root}", override), loader_only=True)
    line = one_line(result)
    assert line.startswith(f"--set {override}: {override.split('=')[0]}: ")
    assert not root.exists()


# ---------------------------------------------------------------- what the recipe path is


def test_a_fifo_is_said_to_be_one_and_never_read(tmp_path: Path) -> None:
    fifo = tmp_path / "recipe.yaml"
    os.mkfifo(fifo)
    assert one_line(run("validate", str(fifo))) == f"{fifo}: is a FIFO, not a file"


def test_a_device_is_said_to_be_one_and_never_read() -> None:
    assert one_line(run("validate", "/dev/zero", loader_only=True)) == "/dev/zero: is a device, not a file"


def test_a_huge_recipe_is_not_read(tmp_path: Path) -> None:
    recipe = tmp_path / "big.yaml"
    recipe.write_text(TINY.read_text() + ("# padding\n" * 200_000))
    line = one_line(run("validate", str(recipe), loader_only=True))
    assert line == f"{recipe}: is larger than 1024 KiB; a recipe is a small YAML file"


# ---------------------------------------------------------------- messages: one line, located, right


@pytest.mark.parametrize(
    "override, start",
    [
        ("name=ti\nny", "--set name=ti\\nny: name: string should match pattern"),
        ("benchmark.min_s=[1,\n", "--set benchmark.min_s=[1,\\n: benchmark.min_s: cannot parse"),
    ],
    ids=["invalid", "unparsable"],
)
def test_a_newline_in_an_override_stays_on_one_line(override: str, start: str) -> None:
    assert one_line(run("validate", str(TINY), *sets(override))).startswith(start)


def test_a_long_name_is_refused_by_validate() -> None:
    name = "n" * 300
    line = one_line(run("validate", str(TINY), *sets(f"name={name}")))
    assert line == f"--set name={name}: name: must be at most 100 characters (got 300)"


@pytest.mark.parametrize("command", ["validate", "deploy"])
def test_a_store_inside_the_package_is_refused(command: str) -> None:
    folder = ROOT / "pipeline" / f".bounded-test-{os.getpid()}-{command}"
    assert not folder.exists()
    try:
        result = run(command, str(TINY), *sets(*FAST, f"output.root={folder}"))
        assert one_line(result) == (
            f"--set output.root={folder}: output.root: {folder}/tiny is inside the pipeline's own package "
            f"folder {ROOT / 'pipeline'}; versions written there would be mixed into the code (choose a root "
            "outside it)"
        )
        assert not folder.exists()
    finally:
        shutil.rmtree(folder, ignore_errors=True)


# ---------------------------------------------------------------- dims against the model and the machine


def test_a_sequence_beyond_the_models_positions_is_refused_for_an_entrypoint_model() -> None:
    """A transformers model built by a factory (GPT-2 of 64 positions) has its config read like a Hugging Face
    source's: a longer sequence would fail deep in an export, not at pre-flight."""
    recipe = ROOT / "tests/zoo/recipes/gpt2.yaml"
    line = one_line(run("validate", str(recipe), *sets("dims.sequence.max=100")))
    assert line.endswith(
        "dims.sequence.max: must not exceed the model's max_position_embeddings (64) (got 100)"
    )


def test_dims_whose_inputs_do_not_fit_in_memory_are_refused() -> None:
    """Images of 8192 x 8192 at batch 8 (the benchmark's) are 6 GiB of inputs alone: on a 24 GB machine more
    than a quarter of what it has available. Too large to probe, so the inputs alone are weighed."""
    from pipeline.preflight.memory_check import available_memory

    available = available_memory()
    if available is None or available > 24 * 2**30:  # 4 x 6 GiB would fit
        pytest.skip(f"this machine has {available} bytes available: the images would fit")
    recipe = ROOT / "recipes/examples/cnn/cnn.yaml"
    overrides = [
        "inputs[0].shape=[batch, 3, size, size]",
        "dims.size={min: 16, opt: 16, max: 8192}",
        "dims.batch={min: 1, opt: 4, max: 8}",
        "benchmark.batch_sizes=[1, 8]",
    ]
    line = one_line(run("validate", str(recipe), *sets(*overrides)))
    assert (
        "dims.size.max: the inputs alone take 6.0 GiB when size = 8192 at batch 8: more than a quarter"
        in line
    )
