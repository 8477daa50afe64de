"""Every recipe key invalidates exactly the stages that read it.

The keys are enumerated from the recipe's pydantic models, so a key added tomorrow is covered here the day it is
added. For each key the test changes it (to another valid value), builds the plan in-process against a previous
version made from the unchanged recipe, and asserts that `plan` calls stale exactly the stages whose config
changed and what is built from their outputs (those "input will be rebuilt"), and that no config changed where
its fingerprint did not. A key that no stage reads must be listed in NOT_READ with who does read it, and a listed
key must stay unread. Since a stage's run sees only its config (test_runs_capture_no_recipe), "whose config
changed" is "which stages read it".
"""

from __future__ import annotations

import hashlib
import inspect
import json
import re
import types
import typing
from collections.abc import Iterator
from functools import partial
from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel

from pipeline.core.errors import PipelineError
from pipeline.recipe import Recipe
from pipeline.recipe.loader import load
from pipeline.release.store import Store
from pipeline.run.executor import Executor
from pipeline.run.freshness import fingerprint
from pipeline.run.plan import plan_stages
from pipeline.stages.base import Stage
from pipeline.stages.record import StageRecord

ROOT = Path(__file__).resolve().parents[2]
TINY = ROOT / "tests/recipes/tiny.yaml"
ALL_VARIANTS = (
    "[torchscript-fp32, onnx-fp32, onnx-fp16, onnx-int8, onnx-int8-dynamic, onnx-optimized-fp32, "
    "onnx-optimized-fp16, tensorrt-fp16, tensorrt-rtx-fp32, engine-int8, exported-fp16, aoti-fp16]"
)
# Every optional section filled in, so that every key has a value to change.
FULL = [
    f"variants.build={ALL_VARIANTS}",
    "variants.gpu=[exported-bf16]",
    "runtime.padding={per_token_outputs: [hidden]}",
    "tracking.mlflow={uri: mlruns, experiment: tiny}",
    "export.tensorrt.profiles=[{dims: {batch: {min: 1, opt: 2, max: 8}}}]",
    "validation.tolerances.fp16.outputs={pooled: {cosine: 0.99, informational: [max_abs]}}",
    "selection.max_p99_ms=1000",
    "selection.runtimes=[onnxruntime-cpu, torch-cpu]",
    "selection.objective.sequence_length=16",
    "selection.objective.io=host",
    "benchmark.intra_op_threads=2",
    "benchmark.runtimes=[onnxruntime-cpu, torch-cpu]",
    "benchmark.scenarios=[single_stream, offline, server]",
    "model.kwargs={hidden: 64, layers: 2}",
]
# Keys the stages do not read, and who does.
NOT_READ = {
    "output.root": "where the store lies",
    "output.lock_timeout_s": "how long a deploy waits for the store's lock",
    "model.build_timeout_s": "pre-flight's bound on importing, building and running the model",
    "tracking.mlflow.uri": "run tracking, after sign-off",
    "tracking.mlflow.experiment": "run tracking, after sign-off",
    "tracking.required": "the exit code, after sign-off and tracking",
    "selection.regression.max_slowdown": "compare's release gate",
    "selection.regression.max_accuracy_loss": "compare's release gate",
}
# Changes that need a companion change to stay a valid recipe: key -> the --set overrides to apply.
CHANGES = {
    # a key-padding mask cannot drive padding-aware runs, so the recipes' mask leaves validation with it
    "validation.padding_value": ["validation.padding_value=1", "validation.padding_mask=null"],
    "dims.batch.min": ["dims.batch.min=2", "benchmark.batch_sizes=[2]", "selection.objective.batch=2"]
    + ["validation.corner_batches={min: 2, opt: 2, max: 2}"],
    "dims.sequence.max": ["dims.sequence.max=64"],
    "dims.sequence.min": ["dims.sequence.min=8"],
    "inputs[0].name": ["inputs[0].name=ids"],
    "inputs[1].name": ["inputs[1].name=mask", "runtime.padding.mask_input=mask"],
    "outputs[0]": ["outputs[0]=states", "runtime.padding.per_token_outputs=[states]"],
    "outputs[1]": ["outputs[1]=embedding", "validation.tolerances.fp16.outputs={embedding: {cosine: 0.99}}"],
    "benchmark.batch_dim": ["benchmark.batch_dim=other", "benchmark.batch_sizes=[1]"],  # then: unbatched
    "runtime.padding.mask_input": ["runtime.padding.mask_input=input_ids"],
    "benchmark.scenarios": ["benchmark.scenarios=[single_stream, server]"],  # no throughput run; still a load
    "selection.objective.p99_ms": [
        "selection.objective.metric=max_qps_at_p99",
        "selection.objective.p99_ms=20",
    ],
    **{  # precisions the recipe does not write hold their defaults (merged), with no per-output overrides
        f"validation.tolerances.{p}.outputs": [
            f"validation.tolerances.{p}.outputs={{pooled: {{cosine: 0.99}}}}"
        ]
        for p in ("fp32", "int8", "bf16", "fp8")
    },
    "validation.tolerances.fp16.outputs.pooled.outputs": [
        "validation.tolerances.fp16.outputs.pooled.outputs={pooled: {cosine: 0.5}}"
    ],
    "benchmark.sequence_dim": ["benchmark.sequence_dim=null", "runtime.padding=null"]
    + ["benchmark.sequence_lengths=[]", "selection.objective.sequence_length=null"],
    "model.entrypoint": ["model.entrypoint=tests.models.tiny:cnn", "model.kwargs={}"],
    "data.samples.path": [f"data.samples.path={ROOT / 'README.md'}"],  # any other file: its bytes differ
}
SKIPPED = {  # the discriminators: every source's own keys are changed through SOURCES
    "model.source": "which source: each source's keys are covered by a recipe of its own",
    "data.samples.source": "which data source: each source's keys are covered by a recipe of its own",
    "export.int8.quantizer": "one choice (onnxruntime): nothing to change it to",
}
SOURCES = {  # one recipe per model source and data source, for the keys of the union members
    "huggingface+text": (ROOT / "recipes/bert.yaml", []),
    "entrypoint+npz": (ROOT / "recipes/examples/cnn/cnn.yaml", []),
    "torchvision": (TINY, [*FULL, "model={source: torchvision, name: resnet18}"]),
}


# ---------------------------------------------------------------- the keys


def _unwrap(annotation: Any) -> list[Any]:
    """The member types of an annotation (Annotated, Optional and unions taken apart)."""
    origin = typing.get_origin(annotation)
    if origin is typing.Annotated:
        return _unwrap(typing.get_args(annotation)[0])
    if origin in (typing.Union, types.UnionType):
        return [t for arg in typing.get_args(annotation) for t in _unwrap(arg)]
    return [annotation]


def _models(annotation: Any) -> Iterator[tuple[str, type[BaseModel]]]:
    """('' | '[]' | '.*', model) for each model an annotation holds directly, in a list or in a dict."""
    for member in _unwrap(annotation):
        origin = typing.get_origin(member)
        if isinstance(member, type) and issubclass(member, BaseModel):
            yield "", member
        elif origin in (list, dict):
            for _, inner in _models(typing.get_args(member)[-1]):
                yield ("[]" if origin is list else ".*"), inner


def schema_keys(model: type[BaseModel] = Recipe, prefix: str = "", within: tuple = ()) -> set[str]:
    """Every leaf key the recipe's models declare, dict keys as '*' and list items as '[]' (a model nested in
    itself, a tolerance's per-output overrides, is walked once)."""
    keys = set()
    for name, field in model.model_fields.items():
        path = f"{prefix}.{name}" if prefix else name
        nested = [(suffix, inner) for suffix, inner in _models(field.annotation) if inner not in within]
        if not list(_models(field.annotation)):
            keys.add(path)
        for suffix, inner in nested:
            keys |= schema_keys(inner, path + suffix, (*within, model))
    return keys


def value_keys(value: BaseModel, prefix: str = "", shape: str = "") -> Iterator[tuple[str, str, Any]]:
    """(key path, its schema shape, the field's annotation) of every leaf the recipe sets a value for."""
    for name, field in type(value).model_fields.items():
        path, form = (f"{prefix}.{name}", f"{shape}.{name}") if prefix else (name, name)
        child = getattr(value, name)
        if isinstance(child, BaseModel):
            yield from value_keys(child, path, form)
        elif isinstance(child, list) and child and all(isinstance(c, BaseModel) for c in child):
            for i, item in enumerate(child):
                yield from value_keys(item, f"{path}[{i}]", f"{form}[]")
        elif isinstance(child, dict) and child and all(isinstance(c, BaseModel) for c in child.values()):
            for key, item in child.items():
                yield from value_keys(item, f"{path}.{key}", f"{form}.*")
        elif isinstance(child, dict) and child:  # a mapping of values: each entry is a key of its own
            for key in child:
                yield f"{path}.{key}", form, _value_type(field.annotation)
        elif not list(_models(field.annotation)) or child is not None:
            yield path, form, field.annotation


def _value_type(annotation: Any) -> Any:
    mapping = next(m for m in _unwrap(annotation) if typing.get_origin(m) is dict)
    return typing.get_args(mapping)[1]


# ---------------------------------------------------------------- changing one key


def _literals(annotation: Any) -> list[Any]:
    found = []
    for member in _unwrap(annotation):
        if typing.get_origin(member) is typing.Literal:
            found += list(typing.get_args(member))
        elif typing.get_origin(member) is list:
            found += _literals(typing.get_args(member)[0])
    return found


def _candidates(value: Any, annotation: Any) -> list[Any]:
    """Other values of the key's type, most natural first (null last, where the key may be null)."""
    nullable = type(None) in _unwrap(annotation) and value is not None
    found = [c for c in _other_values(value, annotation) if c != value]
    return found + [None] if nullable else found


def _other_values(value: Any, annotation: Any) -> list[Any]:
    literals = [v for v in _literals(annotation) if v != value]
    if isinstance(value, bool):
        return [not value]
    if isinstance(value, int | float) and not literals:
        return [value + 1, value - 1, value * 2, value / 2, value * 0.9]
    if isinstance(value, list):
        extra = [v for v in literals if v not in value]
        more = [value + [extra[0]]] if extra else []
        if all(isinstance(v, int) for v in value) and value:
            more.append(value + [max(value) + 1])
        return more + [value[:-1], value + ["x"] if not value or isinstance(value[0], str) else []]
    if isinstance(value, dict):
        return [{**value, "x": 1}, {}]
    if value is None:
        members = [m for m in _unwrap(annotation) if m is not type(None)]
        return [*literals, *[{int: 1, float: 0.5, str: "x", list: []}.get(m) for m in members]]
    return [*literals, f"{value}x"] if isinstance(value, str) else literals


def _overrides(base: Recipe, key: str, annotation: Any) -> list[list[str]]:
    if key in CHANGES:
        return [CHANGES[key]] if CHANGES[key] else []
    value = base.model_dump(mode="json")
    for part in re.findall(r"[^.\[\]]+", key):
        value = value[int(part)] if isinstance(value, list) else value[part]
    return [[f"{key}={json.dumps(v)}"] for v in _candidates(value, annotation)]


def changed_recipes(path: Path, base: list[str], key: str, annotation: Any) -> Iterator[Recipe]:
    """The recipe with the key changed, once per valid change."""
    recipe = load(path, base).recipe
    for change in _overrides(recipe, key, annotation):
        try:
            yield load(path, [*base, *change]).recipe
        except PipelineError:
            continue


# ---------------------------------------------------------------- plan against a previous version


class _SharedEnvironment(Executor):
    """Environment keys computed once per stage name for the whole module (they are host facts)."""

    cache: dict[str, dict[str, Any]] = {}

    def environment(self, stage: Stage) -> dict[str, Any]:
        if stage.name not in self.cache:
            self.cache[stage.name] = stage.environment()
        return self.cache[stage.name]


def _sha(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def previous_version(stages: list[Stage], folder: Path) -> dict[str, StageRecord]:
    """The run record a deploy of `stages` would leave, with one small real file per artifact."""
    known: dict[str, str] = {}
    records = {}
    env = _SharedEnvironment([], None, [])  # type: ignore[arg-type]
    for stage in stages:
        inputs = {n: known[n] for n in (*stage.consumes, *stage.consumes_any) if n in known}
        environment = env.environment(stage)
        outputs = []
        for artifact in stage.produces:
            (folder / f"{artifact}.bin").write_text(artifact)
            known[artifact] = _sha(artifact)
            outputs.append({"artifact": artifact, "path": f"{artifact}.bin", "sha256": known[artifact]})
        records[stage.name] = StageRecord(
            stage.name,
            stage.version,
            fingerprint(stage, inputs, environment),
            "ran",
            stage.config.fingerprinted(),
            environment,
            inputs,
            outputs,
        )
    return records


@pytest.fixture(scope="module")
def previous(tmp_path_factory: pytest.TempPathFactory):
    """Per base recipe: (its stages by name, a store, the previous version's folder and records)."""

    def make(path: Path, base: list[str]) -> tuple[dict[str, Stage], Store, Path, dict[str, StageRecord]]:
        key = json.dumps([str(path), base])
        if key not in cache:
            root = tmp_path_factory.mktemp("store")
            folder = root / "v0001"
            folder.mkdir()
            stages = plan_stages(load(path, base).recipe, path.parent)
            cache[key] = (
                {s.name: s for s in stages},
                Store(root, "x"),
                folder,
                previous_version(stages, folder),
            )
        return cache[key]

    cache: dict[str, Any] = {}
    return make


def built_from(stages: list[Stage], readers: set[str]) -> set[str]:
    """The readers and every stage that consumes, directly or not, what a reader makes."""
    closure, made = set(readers), set()
    for stage in stages:  # plan order: producers come first
        if stage.name in closure or made & {*stage.consumes, *stage.consumes_any}:
            closure.add(stage.name)
            made |= set(stage.produces)
    return closure


def check_key(previous, path: Path, base: list[str], key: str, annotation: Any) -> str:
    """'read' or 'unread' when changing the key invalidates exactly the stages whose config holds it (and
    what is built from their outputs); else what is wrong."""
    stages, store, folder, records = previous(path, base)
    valid = False
    for changed in changed_recipes(path, base, key, annotation):
        valid = True
        now = plan_stages(changed, path.parent)
        readers = {
            s.name
            for s in now
            if s.name not in stages or stages[s.name].config.fingerprinted() != s.config.fingerprinted()
        }
        unseen = {s.name for s in now if s.name in stages and stages[s.name].config != s.config} - readers
        if unseen:  # a field left out of the fingerprint changed without anything it stands for changing
            return f"{key}: the configs of {sorted(unseen)} changed, but not their fingerprints"
        verdicts = _SharedEnvironment(now, store, [(folder, records)]).plan()
        stale = {s.name for s, v in verdicts if not v.fresh}
        rebuilt = {s.name for s, v in verdicts if not v.fresh and v.why.startswith("input will be rebuilt")}
        if stale - rebuilt - readers or stale != built_from(now, readers):
            return (
                f"{key}: plan calls {sorted(stale)} stale ({sorted(rebuilt)} for their inputs), "
                f"the configs that changed are {sorted(readers)}"
            )
        if readers and key in NOT_READ:
            return f"{key} is listed as read by no stage, but {sorted(readers)} read it"
        if readers:
            return "read"
    return "unread" if valid else f"{key}: no valid change found (add one to CHANGES)"


# ---------------------------------------------------------------- the tests


def _base_keys() -> list[tuple[str, str, Any]]:
    return sorted(value_keys(load(TINY, FULL).recipe), key=lambda k: k[0])


def test_every_key_of_the_schema_is_changed_by_this_test() -> None:
    covered = {shape for _, shape, _ in _base_keys()}
    for path, base in SOURCES.values():
        covered |= {shape for _, shape, _ in value_keys(load(path, base).recipe)}
    missing = sorted(schema_keys() - covered)
    assert not missing, f"keys no base recipe here sets (extend FULL or SOURCES): {missing}"


def test_each_key_invalidates_exactly_the_stages_that_read_it(previous) -> None:
    """Every key of the fully configured tiny recipe, and the model and data keys of a recipe per source: a
    key must be read where it is set (by the stages whose config holds it) in at least one of them."""
    outcomes: dict[str, set[str]] = {}
    keys = [(TINY, FULL, key, shape, annotation) for key, shape, annotation in _base_keys()]
    for path, base in SOURCES.values():
        keys += [
            (path, base, key, shape, annotation)
            for key, shape, annotation in value_keys(load(path, base).recipe)
            if key.startswith(("model.", "data."))
        ]
    for path, base, key, shape, annotation in keys:
        if key not in SKIPPED:
            outcomes.setdefault(shape, set()).add(check_key(previous, path, base, key, annotation))
    problems = sorted(o for found in outcomes.values() for o in found if o not in ("read", "unread"))
    problems += [
        f"{shape}: no stage reads it; make a stage's config hold it, or list it in NOT_READ with who does"
        for shape, found in sorted(outcomes.items())
        if "read" not in found and shape not in NOT_READ
    ]
    assert not problems, "\n".join(problems)


def test_runs_capture_no_recipe() -> None:
    """A stage's run sees its config and inputs only: no part of the recipe hides in a closure or a bound
    argument (the config comes as an argument, so a run captures no settings at all)."""
    for stage in plan_stages(load(TINY, FULL).recipe, TINY.parent):
        run = stage.run
        bound = [*run.args, *run.keywords.values()] if isinstance(run, partial) else []
        func = run.func if isinstance(run, partial) else run
        captured = [*inspect.getclosurevars(func).nonlocals.values(), *bound]
        assert not any(isinstance(v, BaseModel) for v in captured), stage.name
