"""Writes images.npz, the example's representative inputs: one array per model input, named as the recipe
names the input, samples along the first axis (here `images`, shape (32, 3, 16, 16), float32).

Real data belongs here: a few dozen to a few hundred inputs like those the model will serve. These are
smooth synthetic patterns, deterministic, so that the example needs no download."""

from pathlib import Path

import numpy as np


def images(count: int = 32, size: int = 16, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:size, 0:size] / size
    out = np.empty((count, 3, size, size), np.float32)
    for i in range(count):
        for c in range(3):
            fx, fy, phase = rng.uniform(0.5, 3.0), rng.uniform(0.5, 3.0), rng.uniform(0, 2 * np.pi)
            out[i, c] = np.sin(2 * np.pi * (fx * x + fy * y) + phase)
    return out


if __name__ == "__main__":
    np.savez(Path(__file__).with_name("images.npz"), images=images())
