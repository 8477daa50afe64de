"""Building blocks of the recipe schema: the strict base model and the value types its fields share."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field

from pipeline.runtimes import RUNTIMES
from pipeline.variants import PRECISIONS, VARIANTS

PositiveInt = Annotated[int, Field(gt=0)]
PositiveFloat = Annotated[float, Field(gt=0)]
Fraction = Annotated[float, Field(ge=0, le=1)]
Precision = Literal[PRECISIONS]  # type: ignore[valid-type]
Metric = Literal["max_abs", "mean_abs", "max_rel", "cosine", "neighbours"]
METRICS: tuple[str, ...] = ("max_abs", "mean_abs", "max_rel", "cosine", "neighbours")
Runtime = Literal[RUNTIMES]  # type: ignore[valid-type]
CompileMode = Literal["default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs"]

VariantName = Literal[VARIANTS]  # type: ignore[valid-type]


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
