"""Building blocks of the recipe schema: the strict base model and the value types its fields share.

Every number a recipe holds has a finite range: no inf or nan anywhere (`allow_inf_nan=False` on every model:
an infinite window never ends, and JSON cannot hold either), and an upper bound on every size, count and
duration, chosen from what the hosts this runs on can do (a 2-core 24 GB CPU machine, an H200 with 139 GB):
past it a deploy would hang or be killed instead of failing at once with the key's place. A field that needs
a tighter bound says so with its own type."""

from __future__ import annotations

import math
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field
from pydantic_core import PydanticCustomError

from pipeline.core.variants import PRECISIONS, VARIANTS

MAX_COUNT = 2**31 - 1  # the default ceiling of a count: what a 32-bit signed integer holds
MAX_DIM = 4_194_304  # 2**22 per axis: a 4 M-sample audio clip, a 2048 x 2048 image flattened; one int64
# input of that length is 32 MiB a sample, and the H200 runs out of memory in attention long before
MAX_ELEMENTS = 2**31 - 1  # one input tensor at its largest shape: the largest TensorRT builds for (32-bit
# element indices), and 8 GiB as float32, past what the CPU host holds beside the copies validation makes
MAX_BATCH = 65_536  # a batch of 64 Ki small sequences already fills an H200; a CPU host gives up far earlier
MAX_SAMPLES = 100_000  # drawn, calibrated on or validated: 100 k samples take hours on the CPU host already
MAX_SEED = 2**32 - 1  # numpy seeds with 32 bits
MAX_BENCH_S = 600.0  # a benchmark duration, per row: minutes (rows multiply: artifacts x runtimes x shapes)
MAX_BUILD_S = 86_400  # a build, a compile, a wait for a lock: a day (TensorRT's tactic search takes hours)
MAX_ITERS = 1_000_000  # iterations per row: a million calls of a microsecond model is a second
MAX_THREADS = 1024  # more than any host has cores
MAX_ERROR = 1e6  # an absolute or relative error bound at unit scale: past it every finite output passes
# (write the metric as null, or list it as informational, to stop it gating)
FLOAT32_MAX = 3.4028234663852886e38  # the widest value an input dtype holds (checks.DTYPE_RANGES refines)

PositiveInt = Annotated[int, Field(gt=0, le=MAX_COUNT)]
PositiveFloat = Annotated[float, Field(gt=0, le=1e9)]
Fraction = Annotated[float, Field(ge=0, le=1)]
Dim = Annotated[int, Field(gt=0, le=MAX_DIM)]
Batch = Annotated[int, Field(gt=0, le=MAX_BATCH)]
Samples = Annotated[int, Field(gt=0, le=MAX_SAMPLES)]
Seed = Annotated[int, Field(ge=0, le=MAX_SEED)]
Iterations = Annotated[int, Field(gt=0, le=MAX_ITERS)]
Threads = Annotated[int, Field(gt=0, le=MAX_THREADS)]
BenchSeconds = Annotated[float, Field(gt=0, le=MAX_BENCH_S)]
BuildSeconds = Annotated[int, Field(gt=0, le=MAX_BUILD_S)]
ErrorBound = Annotated[float, Field(gt=0, le=MAX_ERROR)]
Value = Annotated[float, Field(ge=-FLOAT32_MAX, le=FLOAT32_MAX)]
Ratio = Annotated[float, Field(ge=0, le=100)]  # a relative change: 100 is a hundredfold


def _non_finite_at(value: object, where: str = "") -> str | None:
    """Where in nested data a float is inf or nan ('' for the value itself), else None."""
    if isinstance(value, float) and not math.isfinite(value):
        return where
    items = value.items() if isinstance(value, dict) else enumerate(value) if isinstance(value, list) else ()
    for key, item in items:
        found = _non_finite_at(item, f"{where}[{key}]" if isinstance(key, int) else f"{where}.{key}")
        if found is not None:
            return found
    return None


def _finite(value: object) -> object:
    where = _non_finite_at(value)
    if where == "":
        raise PydanticCustomError("finite_number", "not a finite number")
    if where is not None:
        raise PydanticCustomError(
            "finite_data", "holds a number that is not finite at {where}", {"where": where.lstrip(".")}
        )
    return value


# Free-form data (factory arguments): the recipe, the manifest and the fingerprints hold it as JSON, which has
# no inf or nan, so those are refused at any depth as they are in every typed field.
FiniteData = Annotated[object, AfterValidator(_finite)]
Precision = Literal[PRECISIONS]  # type: ignore[valid-type]
Metric = Literal["max_abs", "mean_abs", "max_rel", "cosine", "neighbours"]
METRICS: tuple[str, ...] = ("max_abs", "mean_abs", "max_rel", "cosine", "neighbours")


class _RuntimeName:
    """Marks a runtime's name in the JSON Schema (x-runtime): the runtimes are declared by the runner modules
    installed (pipeline/runners/registry.py), so pre-flight checks the names, and the schema command lists
    them (pipeline/recipe/json_schema.py)."""

    @classmethod
    def __get_pydantic_json_schema__(cls, core_schema: Any, handler: Any) -> dict[str, Any]:
        return {**handler(core_schema), RUNTIME_MARK: True}


RUNTIME_MARK = "x-runtime"
Runtime = Annotated[str, Field(min_length=1, max_length=100), _RuntimeName]
CompileMode = Literal["default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs"]

VariantName = Literal[VARIANTS]  # type: ignore[valid-type]


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)
