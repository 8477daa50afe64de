"""Turns a YAML file plus --set overrides into a validated Recipe, or into located one-line problems."""

from __future__ import annotations

import copy
import difflib
import re
import typing
from dataclasses import dataclass
from pathlib import Path

import yaml
from pydantic import BaseModel, ValidationError

from pipeline.core.errors import Problem, RecipeError, did_you_mean
from pipeline.recipe import (
    HuggingFaceSource,
    NpzData,
    Recipe,
    TextData,
    TorchScriptSource,
    cross_field_problems,
    dotted,
    split_dotted,
)
from pipeline.recipe.yaml_source import YamlLimit, not_a_file, parse_value, read_mapping

Loc = tuple


@dataclass(frozen=True)
class LoadedRecipe:
    recipe: Recipe
    path: Path  # the recipe file as given
    raw: dict  # the YAML data with overrides applied
    overrides: tuple[str, ...]
    locator: typing.Callable[[Loc, bool], str]
    deferred: tuple[Problem, ...] = ()  # cross-field problems left for the pre-flight check to report

    def where(self, key: str) -> str:
        """`file:line:col` (or `--set k=v`) of a dotted key, for pre-flight problems found after loading."""
        return self.locator(tuple(split_dotted(key)), False)

    def problem(self, key: str, message: str) -> Problem:
        return Problem(self.where(key), key, message)


def _data_path(data: object, loc: Loc) -> Loc:
    """Drop pydantic's union tags from an error location so it names keys that exist in the YAML."""
    out: list = []
    for i, part in enumerate(loc):
        last = i == len(loc) - 1
        if isinstance(data, dict) and data.get("source") == part and not last:
            continue  # a discriminated union's tag (model: {source: entrypoint, entrypoint: ...})
        if (
            isinstance(data, dict)
            and part in data
            or isinstance(data, list)
            and isinstance(part, int)
            and part < len(data)
        ):
            data = data[part]
            out.append(part)
        elif last and isinstance(data, dict):
            out.append(part)  # a missing key: name it
    return tuple(out)


def _model_at(loc: Loc, data: object) -> type[BaseModel] | None:
    """The pydantic model that validates the mapping at `loc` (to suggest keys it knows)."""
    model: object = Recipe
    for part in loc:
        if isinstance(data, dict):
            data = data.get(part)
        elif isinstance(data, list) and isinstance(part, int):
            data = data[part] if part < len(data) else None
        model = _unwrap(model, part, data)
        if model is None:
            return None
    model = _unwrap(model, None, data)
    return model if isinstance(model, type) and issubclass(model, BaseModel) else None


def _unwrap(tp: object, part: object, data: object) -> object:
    if isinstance(tp, type) and issubclass(tp, BaseModel):
        if part is None:
            return tp
        field = tp.model_fields.get(str(part))
        return _unwrap(field.annotation, None, data) if field else None
    origin = typing.get_origin(tp)
    args = typing.get_args(tp)
    if origin is typing.Annotated:
        return _unwrap(args[0], part, data)
    if origin in (list, dict):
        return _unwrap(args[-1], None, data) if part is not None else tp
    if args:  # a union: the member whose discriminator matches the data, else the first model
        models = [a for a in args if isinstance(a, type) and issubclass(a, BaseModel)]
        for m in models:
            lit = m.model_fields.get("source")
            if (
                isinstance(data, dict)
                and lit is not None
                and data.get("source") in typing.get_args(lit.annotation)
            ):
                return _unwrap(m, part, data)
        for a in args:
            if typing.get_origin(a) in (list, dict):
                return _unwrap(a, part, data)
        return _unwrap(models[0], part, data) if models else None
    return None


def _message(err: dict, raw: dict, loc: Loc) -> str:
    kind, got, ctx = err["type"], err.get("input"), err.get("ctx") or {}
    if kind == "extra_forbidden":
        model = _model_at(loc[:-1], raw)
        names = list(model.model_fields) if model else []
        close = difflib.get_close_matches(str(loc[-1]), names, n=1, cutoff=0.5)
        hint = (
            f"; did you mean '{close[0]}'?"
            if close
            else (f"; valid keys: {', '.join(names)}" if names else "")
        )
        return f"unknown key '{loc[-1]}'{hint}"
    if kind == "missing":
        return "required key is missing"
    if kind == "greater_than" and ctx.get("gt") == 0 and isinstance(got, int | float):
        return f"must be a positive {'number' if _is_float_field(loc, raw) else 'integer'} (got {got})"
    if kind in ("greater_than", "greater_than_equal", "less_than", "less_than_equal"):
        bound = next(iter(ctx.values()))
        word = {"greater_than": ">", "greater_than_equal": ">=", "less_than": "<", "less_than_equal": "<="}[
            kind
        ]
        return f"must be {word} {bound} (got {got})"
    if kind in ("int_type", "int_parsing", "int_from_float"):
        return f"must be an integer (got {got!r})"
    if kind in ("float_type", "float_parsing"):
        return f"must be a number (got {got!r})"
    if kind in ("bool_type", "bool_parsing"):
        return f"must be true or false (got {got!r})"
    if kind == "literal_error":
        expected = str(ctx.get("expected"))
        close = did_you_mean(got, re.findall(r"'([^']*)'", expected)) if isinstance(got, str) else None
        if close:
            return f"unknown {got!r}: did you mean {close!r}? (one of {expected})"
        return f"must be one of {expected} (got {got!r})"
    if kind in ("too_short", "string_too_short") and ctx.get("min_length") == 1:
        return "must not be empty"
    if kind == "finite_number":
        return f"must be a finite number (got {got})"
    if kind == "string_too_long" and isinstance(got, str):
        return f"must be at most {ctx.get('max_length')} characters (got {len(got)})"
    if kind == "too_long":
        return f"must have at most {ctx.get('max_length')} items (got {ctx.get('actual_length')})"
    if kind == "union_tag_invalid":
        return f"must be one of {ctx.get('expected_tags')} (got {ctx.get('tag')!r})"
    msg = err["msg"][0].lower() + err["msg"][1:]
    return f"{msg} (got {got!r})" if got is not None and not isinstance(got, dict | list) else msg


def _is_float_field(loc: Loc, raw: dict) -> bool:
    names = [i for i, part in enumerate(loc) if isinstance(part, str)]
    if not names:
        return False
    model = _model_at(loc[: names[-1]], raw)
    field = model.model_fields.get(str(loc[names[-1]])) if model else None
    return field is not None and "float" in str(field.annotation)


def _apply_override(raw: dict, text: str) -> tuple[str, list[str | int]]:
    key, sep, value = text.partition("=")
    if not sep or not key:
        raise RecipeError(problems=[Problem(f"--set {text}", "", "expected dotted.key=value")])
    try:
        parts = split_dotted(key)
        parsed = parse_value(value) if value else None
    except YamlLimit as exc:
        raise RecipeError(problems=[Problem(f"--set {text}", key, exc.message)]) from None
    except (ValueError, yaml.YAMLError) as exc:
        raise RecipeError(
            problems=[Problem(f"--set {text}", key, f"cannot parse: {exc}".splitlines()[0])]
        ) from None
    node: object = raw
    for i, part in enumerate(parts[:-1]):
        nxt = parts[i + 1]
        if isinstance(node, dict):
            node = node.setdefault(part, [] if isinstance(nxt, int) else {})
        elif isinstance(node, list) and isinstance(part, int) and part < len(node):
            node = node[part]
        else:
            raise RecipeError(problems=[Problem(f"--set {text}", key, "no such place in the recipe")])
    last = parts[-1]
    if isinstance(node, dict) and isinstance(last, str):
        node[last] = parsed
    elif isinstance(node, list) and isinstance(last, int) and last <= len(node):
        node[last : last + 1] = [parsed]
    else:
        raise RecipeError(problems=[Problem(f"--set {text}", key, "no such place in the recipe")])
    return text, parts


def load(
    path: str | Path, overrides: list[str] | tuple[str, ...] = (), defer_cross_field: bool = False
) -> LoadedRecipe:
    """Parse, override, validate; raise RecipeError listing every problem with its place.

    defer_cross_field: keep cross-field problems in `LoadedRecipe.deferred` instead of raising them, so that
    the pre-flight check reports them together with its own (one pass, not one layer at a time)."""
    path = Path(path)
    raw, positions, shown = read_mapping(
        path, RecipeError, "cannot read recipe", "a recipe must be a mapping of keys"
    )
    applied = [_apply_override(raw, o) for o in overrides]

    def locate(loc: Loc, key: bool = False) -> str:
        for text_, parts in reversed(applied):
            if tuple(loc[: len(parts)]) == tuple(parts) or tuple(parts[: len(loc)]) == tuple(loc) and key:
                return f"--set {text_}"
        line, col = positions.find(loc, key=key)
        return f"{shown}:{line}:{col}"

    duplicates = [
        Problem(f"{shown}:{line}:{col}", dotted(loc), f"duplicate key '{loc[-1]}' (first at line {first})")
        for loc, (line, col), first in positions.duplicates
    ]
    try:
        recipe = Recipe.model_validate(raw)
    except ValidationError as exc:
        problems = []
        for err in exc.errors():
            if "[key]" in err["loc"]:  # a mapping key outside the allowed set (e.g. a precision name)
                loc = _data_path(raw, tuple(p for p in err["loc"] if p != "[key]"))
                allowed = (err.get("ctx") or {}).get("expected", "")
                problems.append(
                    Problem(
                        locate(loc, key=True), dotted(loc), f"unknown key '{loc[-1]}'; expected {allowed}"
                    )
                )
                continue
            loc = _data_path(raw, err["loc"])
            if err["type"] == "union_tag_invalid":  # name the discriminator key, where the bad value is
                loc = (*loc, str((err.get("ctx") or {}).get("discriminator", "source")).strip("'"))
            problems.append(
                Problem(
                    locate(loc, key=err["type"] == "extra_forbidden"),
                    dotted(loc) or "(root)",
                    _message(err, raw, loc),
                )
            )
        problems = _unique(problems)
        problems += _cross_field_despite(raw, exc, problems, locate)
        raise RecipeError(problems=duplicates + problems) from None
    cross = [Problem(locate(tuple(split_dotted(k))), k, m) for k, m in cross_field_problems(recipe)]
    if duplicates or (cross and not defer_cross_field):
        raise RecipeError(problems=duplicates + cross)
    recipe = absolute_paths(recipe, path.parent.resolve(), Path.cwd())
    return LoadedRecipe(
        recipe=recipe,
        path=path,
        raw=raw,
        overrides=tuple(overrides),
        locator=locate,
        deferred=tuple(cross),
    )


def _cross_field_despite(
    raw: dict, exc: ValidationError, found: list[Problem], locate: typing.Callable[[Loc, bool], str]
) -> list[Problem]:
    """Cross-field problems of a recipe that also has schema errors, so that all are reported in one pass:
    the offending keys are dropped (their defaults stand in, where they have one) and the rest is checked.
    Problems at or under a key already reported are left out; nothing is reported when no valid recipe
    can be made this way (a required key is what is wrong)."""
    repaired = copy.deepcopy(raw)
    errors = exc.errors()
    for _ in range(3):
        for err in errors:
            loc = _data_path(repaired, tuple(p for p in err["loc"] if p != "[key]"))
            parent: object = repaired
            for part in loc[:-1]:
                parent = parent[part] if isinstance(parent, dict | list) else None
            if loc and isinstance(parent, dict):
                parent.pop(loc[-1], None)
        try:
            recipe = Recipe.model_validate(repaired)
        except ValidationError as again:
            errors = again.errors()
            continue
        reported = [p.key for p in found]
        return [
            Problem(locate(tuple(split_dotted(key)), False), key, message)
            for key, message in cross_field_problems(recipe)
            if not any(_touches(key, message, r) for r in reported)
        ]
    return []


def _touches(key: str, message: str, reported: str) -> bool:
    """Whether a cross-field problem involves a key whose value was dropped (it would judge a default the
    user never wrote): the same key, one above or below it, or the key named in its message."""
    related = (
        key == reported or key.startswith((f"{reported}.", f"{reported}[")) or reported.startswith(f"{key}.")
    )
    return related or reported in message


def absolute_paths(recipe: Recipe, recipe_dir: Path, cwd: Path) -> Recipe:
    """The one place where paths are resolved, so that no stage depends on the working directory (some tools
    change it): files the recipe reads are relative to the recipe's folder, the output root to the working
    directory the command was started in (an empty root stays empty, for the checks to report)."""

    def under(base: Path, value: str) -> str:
        return str((base / value).resolve()) if value else value

    updates: dict[str, object] = {}
    samples = recipe.data.samples
    if isinstance(samples, TextData | NpzData):
        moved = samples.model_copy(update={"path": under(recipe_dir, samples.path)})
        updates["data"] = recipe.data.model_copy(update={"samples": moved})
    model = recipe.model
    if isinstance(model, HuggingFaceSource | TorchScriptSource) and model.path:
        updates["model"] = model.model_copy(update={"path": under(recipe_dir, model.path)})
    updates["output"] = recipe.output.model_copy(update={"root": under(cwd, recipe.output.root)})
    return recipe.model_copy(update=updates)


def _unique(problems: list[Problem]) -> list[Problem]:
    seen, out = set(), []
    for p in problems:
        if (p.where, p.key) not in seen:
            seen.add((p.where, p.key))
            out.append(p)
    return out


def resolve_recipe_path(name: str) -> Path:
    """A path if it exists; else recipes/NAME, then recipes/NAME.yaml (as the CLI contract says). A path that
    is there but is no file (a folder, a FIFO, a device) is said to be what it is, and never opened."""
    candidates = (Path(name), Path("recipes") / name, Path("recipes") / f"{name}.yaml")
    for candidate in candidates:
        if candidate.is_file():
            return candidate
    for candidate in candidates:
        kind = not_a_file(candidate)
        if kind:
            raise RecipeError(problems=[Problem(str(candidate), "", kind)])
    raise RecipeError(problems=[Problem(name, "", "no such recipe (also looked in recipes/)")])
