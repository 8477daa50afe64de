"""Pre-flight checks of the recipe's sample file, read in full: decodable, non-empty, holding what the
inputs declare (dtype kind, rank, fixed dims, dynamic dims within min..max) and enough samples for the
calibration and validation splits. Found here rather than minutes into a deploy."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from pipeline.core.errors import Problem
from pipeline.inputs.data import NUMPY_DTYPES
from pipeline.recipe import InputSpec, NpzData, Recipe, TextData
from pipeline.recipe.loader import LoadedRecipe
from pipeline.recipe.yaml_source import line_col


def sample_file_problems(loaded: LoadedRecipe, path: Path) -> list[Problem]:
    """Problems of the sample file; the sample count is checked against calibration + validation."""
    samples = loaded.recipe.data.samples
    if isinstance(samples, TextData):
        problems, count = _text_problems(loaded, path, samples)
    else:
        assert isinstance(samples, NpzData)
        problems, count = _npz_problems(loaded, path)
    if problems:
        return problems
    return _count_problems(loaded, path, count)


def _count_problems(loaded: LoadedRecipe, path: Path, count: int) -> list[Problem]:
    data = loaded.recipe.data
    if count == 0:
        return [loaded.problem("data.samples.path", f"{path} holds no samples")]
    wanted = data.calibration + data.validation
    if count < wanted:
        return [
            loaded.problem(
                "data.calibration",
                f"data.calibration ({data.calibration}) + data.validation ({data.validation}) need {wanted} "
                f"samples, but {path} holds {count} (lower the two counts or add samples)",
            )
        ]
    return []


def _text_problems(loaded: LoadedRecipe, path: Path, samples: TextData) -> tuple[list[Problem], int]:
    data = path.read_bytes()
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        line, col = line_col(data, exc.start)
        return [
            loaded.problem(
                "data.samples.path",
                f"{path}:{line}:{col}: not UTF-8 text (byte 0x{data[exc.start]:02x} at byte offset {exc.start})",
            )
        ], 0
    count, bad = 0, []
    for number, line in enumerate(text.splitlines(), 1):
        line = line.strip()
        if not line:
            continue
        count += 1
        if not line.startswith("{"):
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as exc:
            bad.append(("data.samples.path", f"{path}:{number}:{exc.colno}: not valid JSON ({exc.msg})"))
            continue
        if samples.field not in record:
            found = ", ".join(sorted(record)) or "none"
            bad.append(
                ("data.samples.field", f"{path}:{number} has no field '{samples.field}' (it has {found})")
            )
        elif not isinstance(record[samples.field], str) or not record[samples.field].strip():
            bad.append(
                ("data.samples.field", f"{path}:{number}: field '{samples.field}' is not a non-empty string")
            )
    if bad:
        key, message = bad[0]
        more = f" (and {len(bad) - 1} more bad lines)" if len(bad) > 1 else ""
        return [loaded.problem(key, message + more)], count
    return [], count


def _npz_problems(loaded: LoadedRecipe, path: Path) -> tuple[list[Problem], int]:
    recipe = loaded.recipe
    try:
        npz = np.load(path, allow_pickle=False)
    except Exception as exc:  # noqa: BLE001 - numpy raises zipfile, OS and value errors for a bad file
        return [loaded.problem("data.samples.path", f"cannot read {path} as .npz: {_short(exc)}")], 0
    if not hasattr(npz, "files"):
        return [loaded.problem("data.samples.path", f"{path} holds one array, not an .npz archive")], 0
    problems: list[str] = []
    counts: dict[str, int] = {}
    with npz:
        missing = [s.name for s in recipe.inputs if s.name not in npz.files]
        if missing:
            problems.append(f"{path} has no array for input(s) {', '.join(missing)}")
        for spec in recipe.inputs:
            if spec.name in missing:
                continue
            try:
                array = npz[spec.name]
            except Exception as exc:  # noqa: BLE001 - object arrays (pickles) and damaged members
                problems.append(f"{path}: array '{spec.name}' cannot be read: {_short(exc)}")
                continue
            problem = _array_problem(recipe, spec, array)
            if problem:
                problems.append(f"{path}: array '{spec.name}' {problem}")
            else:
                counts[spec.name] = len(array)
    if not problems and len(set(counts.values())) > 1:
        listed = ", ".join(f"{k} {v}" for k, v in counts.items())
        problems.append(f"{path}: the arrays hold different numbers of samples ({listed})")
    out = [loaded.problem("data.samples.path", p) for p in problems]
    return out, min(counts.values(), default=0)


def _array_problem(recipe: Recipe, spec: InputSpec, array: np.ndarray) -> str | None:
    """Why one stored array cannot feed its input (samples along the first axis), or None."""
    target = np.dtype(NUMPY_DTYPES[spec.dtype])
    if array.dtype.kind not in "biuf":
        return f"holds {array.dtype} values; input '{spec.name}' is {spec.dtype}"
    # integers of any width or sign convert where their values fit (checked below: images saved as int64)
    integers = array.dtype.kind in "biu" and target.kind in "iu"
    if not (integers or np.can_cast(array.dtype, target, casting="same_kind")):
        return f"holds {array.dtype} values, which do not convert to {spec.dtype} without loss"
    if array.ndim != len(spec.shape):
        return (
            f"has rank {array.ndim} (shape {list(array.shape)}); input '{spec.name}' with shape "
            f"{spec.shape} needs rank {len(spec.shape)}, samples along the first axis"
        )
    if array.shape[0] == 0:
        return "holds no samples"
    for axis, dim in enumerate(spec.shape[1:], 1):
        size = array.shape[axis]
        if isinstance(dim, int) and size != dim:
            return f"has {size} along axis {axis}; the input's shape fixes it at {dim}"
        rng = recipe.dims.get(dim) if isinstance(dim, str) else None
        if rng is not None and not rng.min <= size <= rng.max:
            return f"has {size} along axis {axis}, outside dims.{dim} {rng.min}..{rng.max}"
    if array.dtype.kind == "f" and not np.isfinite(array).all():
        return "holds NaN or infinite values"
    if target.kind in "iu" and array.dtype.kind in "iu" and array.size:
        info = np.iinfo(target)
        if array.min() < info.min or array.max() > info.max:
            return f"holds values outside what {spec.dtype} holds ({info.min}..{info.max})"
    if target == np.float16 and array.dtype.kind == "f" and array.size and np.abs(array).max() > 65504:
        return "holds values beyond float16's range (65504)"
    return None


def _short(exc: Exception) -> str:
    text = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
    return text if len(text) <= 200 else text[:197] + "..."
