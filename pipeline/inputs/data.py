"""Representative inputs: samples from the recipe, a deterministic disjoint calibration/validation split,
and batches at any shape (validation corners, benchmark shapes) built from real samples."""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal

import numpy as np

from pipeline.core.errors import RecipeError
from pipeline.inputs.specs import DataSpec
from pipeline.recipe import InputSpec, NpzData, RandomData, TextData

Feeds = dict[str, np.ndarray]
NUMPY_DTYPES = {
    "float32": np.float32,
    "float16": np.float16,
    "int64": np.int64,
    "int32": np.int32,
    "uint8": np.uint8,
    "bool": np.bool_,
}


def read_texts(path: Path, field: str) -> list[str]:
    """JSONL lines with `field`, or plain text lines; blank lines skipped."""
    texts = []
    for line in path.read_text(encoding="utf-8").splitlines():
        line = line.strip()
        if not line:
            continue
        if line.startswith("{"):
            texts.append(str(json.loads(line)[field]))
        else:
            texts.append(line)
    return texts


def off_corner_point(samples: Any, dims: Mapping[str, Any], batch_dim: str) -> dict[str, int] | None:
    """The non-batch dims' sizes between the corners that validation's off-corner run uses (the first dynamic
    dim at a quarter of its range, the next at three quarters, …), or None where that run does not happen: the
    samples are not stored arrays (random and text samples spread over such sizes already), or no size differs
    from a corner. Pre-flight asks it too, to know whether that run happens."""
    if not isinstance(samples, NpzData):
        return None
    point: dict[str, int] = {}
    moved = False
    for k, name in enumerate(n for n in dims if n != batch_dim):
        r = dims[name]
        point[name] = size = round(r.min + (r.max - r.min) * (0.25 if k % 2 == 0 else 0.75))
        moved |= size not in (r.min, r.opt, r.max)
    return point if moved else None


class Dataset:
    """Samples are kept raw (texts or per-sample arrays) and turned into feeds at the shape asked for."""

    def __init__(self, spec: DataSpec, tokenizer: Any = None, model_config: dict[str, Any] | None = None):
        self.spec = spec
        self.tokenizer = tokenizer
        self.model_config = dict(model_config or {})
        data = spec.data
        source = data.samples
        if isinstance(source, TextData):
            self.items: list[Any] = read_texts(_file(spec), source.field)
        elif isinstance(source, NpzData):
            with np.load(_file(spec)) as npz:
                arrays = {inp.name: npz[inp.name] for inp in spec.inputs}
            count = min(len(a) for a in arrays.values())
            self.items = [{k: a[i] for k, a in arrays.items()} for i in range(count)]
        else:
            assert isinstance(source, RandomData)
            count = source.samples or data.calibration + data.validation
            self.items = [self._random_sample(i) for i in range(count)]
        order = np.random.default_rng(data.seed).permutation(len(self.items))
        n_cal = min(data.calibration, len(self.items) // 2)
        n_val = min(data.validation, len(self.items) - n_cal)
        self.calibration_index = [int(i) for i in order[:n_cal]]
        self.validation_index = [int(i) for i in order[n_cal : n_cal + n_val]]

    # ------------------------------------------------------------ splits

    def calibration_hash(self) -> str:
        return hashlib.sha256(
            json.dumps([self._item_key(i) for i in self.calibration_index]).encode()
        ).hexdigest()

    def calibration_feeds(self, batch: int = 1) -> list[Feeds]:
        """Calibration split at natural lengths (text) or stored shapes; never overlaps validation."""
        return self._natural_batches(self.calibration_index, batch)

    def validation_feeds(self, batch: int = 1) -> list[Feeds]:
        return self._natural_batches(self.validation_index, batch)

    def split_feeds(self, split: Literal["calibration", "validation"], batch: int) -> list[Feeds]:
        """A split in batches the recipe's batch range allows, for a graph exported for a fixed batch (min =
        max) holds that size, and a batch of another size fails it for the recipe's sake, not the artifact's:
        `batch` brought within the range, a remainder smaller than its min left out, and a split with no batch
        as large as the min filled up to it with its own samples again."""
        index = self.validation_index if split == "validation" else self.calibration_index
        rng = self.spec.dims.get(self.spec.batch_dim)
        if rng is None:
            return self._natural_batches(index, batch)
        size = rng.clamp(batch)
        whole = [
            f for f in self._natural_batches(index, size) if (n := self.batch_of(f)) is None or n >= rng.min
        ]
        return whole or self._natural_batches(index, size, fill_to=rng.min)

    def batch_of(self, feeds: Feeds) -> int | None:
        """The batch size these feeds hold (None where no input has the batch axis)."""
        for s in self.spec.inputs:
            if self.spec.batch_dim in s.shape and s.name in feeds:
                return int(np.shape(feeds[s.name])[list(s.shape).index(self.spec.batch_dim)])
        return None  # no input holds the batch axis

    # ------------------------------------------------------------ fixed shapes

    def feeds_at(self, dims: dict[str, int], start: int = 0, pool: str = "validation") -> Feeds:
        """A batch with every dynamic dim pinned (from `dims`), filled with real samples from `pool`."""
        index = self.validation_index if pool == "validation" else list(range(len(self.items)))
        batch_dim = self.spec.batch_dim
        batch = dims.get(batch_dim, 1)
        picks = [index[(start + k) % len(index)] for k in range(batch)]
        if isinstance(self.spec.data.samples, TextData):
            seq = dims.get(self.spec.sequence_dim or "")
            return self._tokenize([self.items[i] for i in picks], length=seq)
        shapes = {s.name: self._shape(s, dims) for s in self.spec.inputs}
        starts = [self._crop_starts(self.items[i], shapes) for i in picks]
        return {
            s.name: np.stack(
                [
                    self._fitted(k, s, i, shapes[s.name][1:], start)
                    for i, start in zip(picks, starts, strict=True)
                ]
            ).astype(NUMPY_DTYPES[s.dtype])
            for k, s in enumerate(self.spec.inputs)
        }

    def _fitted(self, k: int, spec: InputSpec, i: int, shape: list[int], start: dict[str, int]) -> np.ndarray:
        """Sample i's value of input k cropped (from `start`, Dataset._crop_starts) or padded to `shape`."""
        value = np.asarray(self.items[i][spec.name])
        starts = [start.get(d, 0) if isinstance(d, str) else 0 for d in spec.shape[1:]]
        return _fit(value, shape, self._filler(k, spec, i, value.shape, shape), starts)

    def _filler(
        self, k: int, spec: InputSpec, i: int, own: tuple[int, ...], shape: list[int]
    ) -> int | np.ndarray:
        """What pads sample i's value of input k to a longer shape. A random sample's filler is drawn as the
        sample was (seeded by the sample, the input and the shape): zeros would make rows of a set alike, and a
        model that ranks them (topk, sort, argmax) ties them, which runtimes break in different orders. Stored
        samples keep their filler (DataSpec.fill), and the padding mask its padding, so that padded positions
        still read as padding."""
        fill = self.spec.fill.get(spec.name, 0)
        random = isinstance(self.spec.data.samples, RandomData)
        if (
            not random
            or (self.spec.padding or ("",))[0] == spec.name
            or all(a >= b for a, b in zip(own, shape, strict=False))
        ):
            return fill
        rng = np.random.default_rng([self.spec.data.seed, i, k, *shape])  # inputs alike differ
        return random_values(spec, list(shape), rng, value_range(spec, self.model_config))

    def _crop_starts(self, item: dict[str, Any], shapes: dict[str, list[int]]) -> dict[str, int]:
        """Where a sample's crop starts along each dim it is cropped in: the first window holding the most
        real tokens of its padding mask (a right-padded sample keeps its start, a left-padded one the start of
        its text: cropped from its first position, a left-padded sample's short corner held padding only, and
        every check there compared nothing)."""
        if self.spec.padding is None:
            return {}
        name, value = self.spec.padding
        spec = next(s for s in self.spec.inputs if s.name == name)
        mask, target = np.asarray(item[name]), shapes[name][1:]
        starts = {}
        for axis, (have, want, dim) in enumerate(zip(mask.shape, target, spec.shape[1:], strict=False)):
            if have <= want or not isinstance(dim, str) or want < 1:
                continue
            real = np.moveaxis(mask != value, axis, 0).reshape(have, -1).sum(axis=1)
            starts[dim] = int(np.argmax(np.convolve(real, np.ones(want, dtype=np.int64), "valid")))
        return starts

    def corner_dims(self, corner: str) -> dict[str, int]:
        return self.spec.corner_dims(corner)

    def corner_feeds(self, corner: str, batch: int | None = None) -> Feeds:
        """Real data at a shape corner, with the batch dim pinned to `batch` when given."""
        dims = self.corner_dims(corner)
        if batch is not None and self.spec.batch_dim in dims:
            dims[self.spec.batch_dim] = batch
        return self.feeds_at(dims)

    def off_corner_feeds(self, batch: int | None = None) -> Feeds | None:
        """Stored arrays (npz) cropped to a shape between the corners, dims out of lockstep (the first dynamic dim
        at a quarter of its range, the next at three quarters, …), or None where there is no such shape. Stored
        samples all have one shape, and the corners are often round and square (32×32, 48×48): an export that
        froze a size-dependent branch (Swin's window padding) failed only at sizes like 36×44. Random samples
        spread over these points already, and text comes at its own lengths."""
        between = off_corner_point(self.spec.data.samples, self.spec.dims, self.spec.batch_dim)
        if between is None:
            return None
        dims = {**self.corner_dims("opt"), **between}
        if batch is not None and self.spec.batch_dim in dims:
            dims[self.spec.batch_dim] = batch
        return self.feeds_at(dims)

    def token_lengths(self) -> list[int]:
        """Natural tokenized lengths of all samples (text data), for representative benchmark shapes."""
        if not isinstance(self.spec.data.samples, TextData):
            return []
        enc = self.tokenizer(self.items, truncation=True, max_length=self._seq_range()[1])
        return [len(ids) for ids in enc["input_ids"]]

    def pad_values(self) -> dict[str, int] | None:
        """Text: each input's value at a padded position, as the tokenizer pads (a load run pads a batch of
        requests to its longest one the same way); None for other data, whose requests are not padded."""
        if not isinstance(self.spec.data.samples, TextData):
            return None
        feeds = self._tokenize(["a", " ".join(["a"] * 64)], length=None)
        at = 0 if getattr(self.tokenizer, "padding_side", "right") == "left" else -1
        return {name: int(array[0, at]) for name, array in feeds.items() if array.ndim > 1}

    # ------------------------------------------------------------ internals

    def _seq_range(self) -> tuple[int, int]:
        seq = self.spec.dims.get(self.spec.sequence_dim or "")
        return (seq.min, seq.max) if seq else (1, 512)

    def _natural_batches(self, index: list[int], batch: int, fill_to: int = 0) -> list[Feeds]:
        """Batches of samples at their own lengths: text is padded to the longest in its batch; other samples
        are grouped by shape (first appearance first), so a batch never mixes shapes. A batch smaller than
        `fill_to` is filled up by wrapping around its group's samples, as `feeds_at` wraps the split."""
        if isinstance(self.spec.data.samples, TextData):
            return [
                self._tokenize([self.items[i] for i in _wrapped(index, start, batch, fill_to)], length=None)
                for start in range(0, len(index), batch)
            ]
        groups: dict[tuple, list[int]] = {}
        for i in index:
            groups.setdefault(tuple(np.shape(self.items[i][s.name]) for s in self.spec.inputs), []).append(i)
        out = []
        for members in groups.values():
            for start in range(0, len(members), batch):
                picks = _wrapped(members, start, batch, fill_to)
                out.append(
                    {
                        s.name: np.stack([np.asarray(self.items[i][s.name]) for i in picks]).astype(
                            NUMPY_DTYPES[s.dtype]
                        )
                        for s in self.spec.inputs
                    }
                )
        return out

    def _tokenize(self, texts: list[str], length: int | None) -> Feeds:
        lo, hi = self._seq_range()
        if length is None:
            enc = self.tokenizer(
                texts, padding="longest", truncation=True, max_length=hi, return_tensors="np"
            )
            if enc["input_ids"].shape[1] < lo:
                enc = self.tokenizer(
                    texts, padding="max_length", truncation=True, max_length=lo, return_tensors="np"
                )
        else:
            enc = self.tokenizer(
                texts, padding="max_length", truncation=True, max_length=length, return_tensors="np"
            )
        feeds = {}
        for spec in self.spec.inputs:
            if spec.name not in enc:
                raise RecipeError(
                    f"inputs: the model's tokenizer does not produce input '{spec.name}' (it gives {', '.join(sorted(enc))})"
                )
            feeds[spec.name] = enc[spec.name].astype(NUMPY_DTYPES[spec.dtype])
        return feeds

    def _shape(self, spec: InputSpec, dims: dict[str, int]) -> list[int]:
        return self.spec.corner_shape(spec, "opt", dims)

    def _random_sample(self, i: int) -> dict[str, np.ndarray]:
        """Sample i at its own point of each dynamic dim's range (the batch dim aside): validation and
        calibration then see short, typical and long inputs, not only the opt shape, and dims in combinations
        (a tall narrow image as well as a square one)."""
        rng = np.random.default_rng([self.spec.data.seed, i])
        # every dim walks through all its points, each dim a step further along than the one before it from
        # one round to the next: two dims (height, width) do not move in lockstep, so non-square shapes come up
        dims = {
            name: lengths[(i + k * (1 + i // len(lengths))) % len(lengths)]
            for k, (name, lengths) in enumerate(self._spread().items())
        }
        sample = {}
        for spec in self.spec.inputs:
            shape = self.spec.corner_shape(spec, "opt", dims)[1:]
            sample[spec.name] = random_values(spec, shape, rng, value_range(spec, self.model_config))
        return sample

    def value_coverage(self, feeds: list[Feeds]) -> dict[str, dict[str, Any]]:
        """Per input, the values the given batches held: smallest, largest, how many distinct (up to
        DISTINCT_CAP), and the shapes they came in. The report states it, so a degenerate range shows."""
        coverage: dict[str, dict[str, Any]] = {}
        for spec in self.spec.inputs:
            arrays = [np.asarray(f[spec.name]) for f in feeds if spec.name in f]
            if not arrays:
                continue
            values = np.concatenate([a.reshape(-1) for a in arrays])
            finite = values[np.isfinite(values)] if values.dtype.kind == "f" else values
            distinct = np.unique(finite[:DISTINCT_SCAN]).size if finite.size else 0
            # smallest and largest by size (as tuples, 1×48 sorted before 2×4 and was shown as the smallest)
            shapes = sorted({tuple(int(d) for d in a.shape) for a in arrays}, key=lambda s: (math.prod(s), s))
            coverage[spec.name] = {
                "dtype": spec.dtype,
                "min": float(finite.min()) if finite.size else None,
                "max": float(finite.max()) if finite.size else None,
                "distinct": min(int(distinct), DISTINCT_CAP),
                "distinct_capped": int(distinct) >= DISTINCT_CAP,
                "shapes": [list(shapes[0]), list(shapes[-1])],
                "dim_ranges": _dim_ranges(shapes),
            }
        return coverage

    def _spread(self) -> dict[str, list[int]]:
        """Lengths drawn per dynamic dim: min, the quartiles of the range, opt and max."""
        spread = {}
        for name, r in self.spec.dims.items():
            if name == self.spec.batch_dim:
                continue
            points = {r.min, r.opt, r.max} | {round(r.min + (r.max - r.min) * f) for f in (0.25, 0.5, 0.75)}
            spread[name] = sorted(points)
        return spread

    def _item_key(self, i: int) -> str:
        item = self.items[i]
        if isinstance(item, str):
            return item
        return hashlib.sha256(b"".join(np.ascontiguousarray(v).tobytes() for v in item.values())).hexdigest()


def _file(spec: DataSpec) -> Path:
    path = spec.file
    assert path is not None, "text and npz samples have a file"
    return path


DISTINCT_CAP = 1000  # value_coverage counts distinct values up to this many
DISTINCT_SCAN = 1_000_000  # ... among at most this many values per input


def value_range(spec: InputSpec, model_config: dict[str, Any] | None = None) -> tuple[float, float]:
    """The low..high random samples of this input are drawn in: the recipe's, else for a transformers model's
    token inputs its vocabulary (input_ids), all ones (attention_mask) or its type vocabulary
    (token_type_ids), else 0..255 for uint8 (an image's bytes: drawn in 0..1 they would be black), else 0..1
    (float inputs; other integer inputs only where the recipe check lets them through: pre-flight probes of npz
    or text data)."""
    config = model_config or {}
    low, high = spec.low, spec.high
    if low is None or high is None:
        vocab = config.get("vocab_size")
        defaults = (
            {
                "input_ids": (0, vocab - 1) if isinstance(vocab, int) and vocab > 0 else None,
                "decoder_input_ids": (0, vocab - 1) if isinstance(vocab, int) and vocab > 0 else None,
                "attention_mask": (1, 1),
                "token_type_ids": (0, max(int(config.get("type_vocab_size") or 1) - 1, 0)),
            }.get(spec.name)
            if spec.dtype in ("int64", "int32")
            else None
        )
        d_low, d_high = defaults or ((0, 255) if spec.dtype == "uint8" else (0.0, 1.0))
        low = d_low if low is None else low
        high = d_high if high is None else high
    return float(low), float(high)


def random_values(
    spec: InputSpec, shape: list[int], rng: np.random.Generator, bounds: tuple[float, float] | None = None
) -> np.ndarray:
    """Values drawn in `bounds` (default: value_range of the input alone; both ends included for integers),
    in the input's dtype."""
    low, high = bounds or value_range(spec)
    if NUMPY_DTYPES[spec.dtype] in (np.int64, np.int32, np.uint8, np.bool_):  # a bool's 0 and 1: False, True
        arr = rng.integers(int(low), int(high), size=shape, endpoint=True)
    else:
        arr = rng.uniform(low, high, size=shape)
    return arr.astype(NUMPY_DTYPES[spec.dtype])


def _fit(
    arr: np.ndarray, shape: list[int], fill: int | np.ndarray = 0, starts: list[int] | None = None
) -> np.ndarray:
    """Crop or pad a stored sample to a target shape (non-text data at a pinned corner); padding is `fill` (a
    value, or an array of the target shape whose values stand where the sample does not: Dataset._filler), a
    crop along an axis begins at its `starts` entry (Dataset._crop_starts; else at 0)."""
    out = np.full(shape, fill, dtype=arr.dtype)
    starts = starts or [0] * len(shape)
    source = tuple(
        slice(start, start + min(a, b)) if a > b else slice(0, a)
        for a, b, start in zip(arr.shape, shape, starts, strict=False)
    )
    target = tuple(slice(0, min(a, b)) for a, b in zip(arr.shape, shape, strict=False))
    out[target] = arr[source]
    return out


def _wrapped(members: list[int], start: int, batch: int, fill_to: int) -> list[int]:
    """members[start : start + batch], at least `fill_to` long (not beyond `batch`), taking members again from
    the first where the slice runs short."""
    picks = members[start : start + batch]
    short = min(fill_to, batch) - len(picks)
    return picks + [members[k % len(members)] for k in range(short)] if short > 0 else picks


def _dim_ranges(shapes: list[tuple[int, ...]]) -> list[list[int]] | None:
    """Each axis's smallest and largest size over the batches: the two shapes largest and smallest by size can
    both miss an axis's extreme (2×1000 is larger than 1×1600, the longest sequence). None where ranks differ."""
    if len({len(s) for s in shapes}) != 1:
        return None
    return [[min(sizes), max(sizes)] for sizes in zip(*shapes, strict=True)]
