"""Whether the model gives the same outputs twice on the same inputs.

A forward that draws random numbers in eval (a VAE's reparameterized sample, random masking, a dropout left
on) can never be matched by an export: every variant then fails validation with cosines that say nothing of
why (a hold-out VAE: "recon cosine -0.599 < 0.9999 at opt"), and the TorchScript check blames the trace. A
second run at the min shape tells it first, by the output, against the FP32 gate's own bound.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

FP32_MAX_ABS = 1e-3  # the FP32 gate's max_abs at unit scale: two runs further apart fail any FP32 export


def changing_outputs(names: list[str], first: list, again: Callable[[], list]) -> list[str]:
    """'recon (max abs difference 3.23)' for each output a second run on the same inputs moves by more than
    the FP32 gate allows (any change, for integer outputs); [] when the second run fails or agrees."""
    second = again()
    if len(second) != len(first):
        return []
    found = []
    for name, a, b in zip(names, first, second, strict=True):
        x, y = _array(a), _array(b)
        if x is None or y is None or x.shape != y.shape:
            continue
        if x.dtype.kind in "iub":
            if not np.array_equal(x, y):
                found.append(f"{name} ({int(np.count_nonzero(x != y))} values differ)")
            continue
        both = np.isfinite(x) & np.isfinite(y)
        if not np.array_equal(np.isfinite(x), np.isfinite(y)):
            found.append(f"{name} (NaN/inf at other positions)")
            continue
        diff = float(np.abs(x[both] - y[both]).max(initial=0.0))
        scale = max(1.0, float(np.abs(x[both]).max(initial=0.0)))
        if diff > FP32_MAX_ABS * scale:
            found.append(f"{name} (max abs difference {diff:.3g})")
    return found


def _array(value: Any) -> np.ndarray | None:
    detach = getattr(value, "detach", None)
    if detach is None:
        return None
    tensor = detach().cpu()
    return (tensor.double() if tensor.is_floating_point() else tensor).numpy()
