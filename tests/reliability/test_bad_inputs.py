"""Bad input, tried as an adversarial user would: every case is a user error (exit 2) with exactly one line
on stderr, located (`file:line:col`, `--set key=value`, or the path given), naming the key, no traceback, and
nothing written under the output root, for `validate` and for `deploy` alike."""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest

from tests.reliability.conftest import ROOT, TINY, run_cli, run_inprocess, sets

BERT = ROOT / "recipes/bert.yaml"
BAD = "tests.reliability.bad_models"


@dataclass(frozen=True)
class Case:
    name: str
    kind: str  # schema | data | model | storage
    expect: str  # in the one line: usually "key: message part"
    replace: tuple[tuple[str, str], ...] = ()  # edits of the recipe text
    overrides: tuple[str, ...] = ()  # --set, formatted with {tmp}
    files: Callable[[Path], None] | None = None  # writes what the case needs under tmp
    at: str | None = None  # the located line must be the (last) line of the edited recipe holding this
    recipe: Path = TINY
    raw: bytes | None = None  # the whole recipe file, for encoding cases
    target: str | None = None  # the RECIPE argument (a folder, a missing file), formatted with {tmp}
    deploy: bool = True  # also run `deploy` (bert cases: validate only, to keep the suite fast)


def npz(**arrays: object) -> Callable[[Path], None]:
    def write(tmp: Path) -> None:
        np.savez(tmp / "d.npz", **arrays)

    return write


def text_file(name: str, data: bytes) -> Callable[[Path], None]:
    def write(tmp: Path) -> None:
        (tmp / name).write_bytes(data)

    return write


IDS = np.ones((20, 16), dtype=np.int64)
NPZ = ("data.samples={source: npz, path: {tmp}/d.npz}",)
JSONL = ("data.samples.path={tmp}/s.jsonl",)
SEQ = "sequence: {min: 4, opt: 16, max: 32}"
TEXT = TINY.read_text()


CASES = [
    # ---------------------------------------------------------------- schema: YAML, encoding, keys, types
    Case(
        "unknown top key", "schema", "colour: unknown key", (("name: tiny\n", "name: tiny\ncolour: red\n"),)
    ),
    Case(
        "unknown nested key",
        "schema",
        "benchmark.batch_size: unknown key 'batch_size'; did you mean 'batch_sizes'?",
        (("benchmark:\n", "benchmark:\n  batch_size: [1]\n"),),
        at="batch_size: [1]",
    ),
    Case(
        "mistyped variant",
        "schema",
        "variants.build[1]: unknown 'onnx-fp23': did you mean 'onnx-fp32'?",
        (("[torchscript-fp32, onnx-fp32]", "[torchscript-fp32, onnx-fp23]"),),
    ),
    Case(
        "mistyped runtime",
        "schema",
        "benchmark.runtimes[0]: unknown runtime 'onnxruntime-cpx': did you mean 'onnxruntime-cpu'?",
        overrides=("benchmark.runtimes=[onnxruntime-cpx]",),
    ),
    Case(
        "wrong type",
        "schema",
        "data.calibration: must be an integer",
        (("calibration: 8", "calibration: lots"),),
    ),
    Case(
        "negative batch", "schema", "benchmark.batch_sizes[1]: must be a positive", (("[1, 2]", "[1, -2]"),)
    ),
    Case(
        "min above max", "schema", "dims.sequence.min: must not exceed max", ((SEQ, SEQ.replace("4", "40")),)
    ),
    Case(
        "opt outside range", "schema", "dims.sequence.opt: must lie within", ((SEQ, SEQ.replace("16", "64")),)
    ),
    Case(
        "broken yaml", "schema", "(yaml): invalid YAML", (("outputs: [hidden, pooled]", "outputs: [hidden"),)
    ),
    Case("tab indent", "schema", "(yaml): invalid YAML", (("  calibration: 8", "\tcalibration: 8"),)),
    Case(
        "duplicate top key",
        "schema",
        "name: duplicate key 'name' (first at line 3)",
        (("name: tiny\n", "name: tiny\nname: other\n"),),
        at="name: other",
    ),
    Case(
        "duplicate nested key",
        "schema",
        "data.calibration: duplicate key 'calibration'",
        (("  calibration: 8\n", "  calibration: 8\n  calibration: 4\n"),),
        at="calibration: 4",
    ),
    Case(
        "not utf-8",
        "schema",
        "(file): not UTF-8 text: byte 0xff at byte offset",
        raw=TEXT.replace("calibration: 8", "calibration: \udcff8").encode("utf-8", "surrogateescape"),
        at="calibration: ",
    ),
    Case(
        "latin-1 comment",
        "schema",
        "(file): not UTF-8 text: byte 0xe8",
        raw=TEXT.replace("# A small", "# Un modèle small").encode("latin-1"),
        at="# Un mod",
    ),
    Case(
        "nul character",
        "schema",
        "(yaml): invalid YAML: character #x0000",
        raw=TEXT.replace("calibration: 8", "calibration: \x008").encode(),
        at="calibration:",
    ),
    Case(
        "error at an alias",
        "schema",
        "benchmark.stable_within: must be < 1.0 (got 8)",
        (
            ("  validation: 8\n", "  validation: &v 8\n"),
            ("benchmark:\n", "benchmark:\n  stable_within: *v\n"),
        ),
        at="stable_within: *v",
    ),
    Case(
        "merge key error",
        "schema",
        "benchmark.warmup_iters: must be a positive integer (got -1)",
        (("benchmark:\n", "benchmark:\n  <<: {warmup_iters: -1}\n"),),
        at="<<: {warmup_iters: -1}",
    ),
    Case("empty file", "schema", "(root): a recipe must be a mapping", raw=b""),
    Case("a list, not a mapping", "schema", "(root): a recipe must be a mapping", raw=b"- name: tiny\n"),
    Case("recipe is a folder", "schema", "is a directory; a recipe is a YAML file", target="{tmp}"),
    Case("no such recipe", "schema", "no such recipe", target="{tmp}/nope.yaml"),
    Case("negative data seed", "schema", "data.seed: must be >= 0 (got -1)", overrides=("data.seed=-1",)),
    Case(
        "negative model seed",
        "schema",
        "model.seed: must be >= 0 (got -5)",
        (("seed: 0, family", "seed: -5, family"),),
    ),
    Case("empty output root", "storage", "output.root: must not be empty", overrides=("output.root=''",)),
    Case(
        "no variants",
        "schema",
        "variants.build: must not be empty",
        overrides=("variants.build=[]", "variants.required=[]"),
    ),
    Case(
        "unknown variant",
        "schema",
        "variants.build[1]: unknown 'onnx-fp64': did you mean 'onnx-fp16'? (one of 'torchscript-fp32'",
        overrides=("variants.build=[onnx-fp32, onnx-fp64]",),
    ),
    Case(
        "required not built",
        "schema",
        "variants.required[0]: 'onnx-fp16' is required",
        overrides=("variants.required=[onnx-fp16]",),
    ),
    Case(
        "high beyond int64",
        "schema",
        "inputs[0].high: must lie within what int64 holds",
        (("high: 999", "high: 1e30"),),
    ),
    Case(
        "low not a number",
        "schema",
        "inputs[0].low: must be a finite number",
        (("low: 1, high: 999", "low: .nan, high: 999"),),
    ),
    Case(
        "float16 range",
        "schema",
        "inputs[1].high: must lie within what float16 holds",
        (
            (
                "dtype: int64, shape: [batch, sequence], low: 1, high: 1}",
                "dtype: float16, shape: [batch, sequence], low: 1, high: 1.0e+6}",
            ),
        ),
    ),
    Case(
        "ids past the vocabulary",
        "model",
        "model: the model fails at the min shape (input_ids [1, 4], attention_mask [1, 4]): IndexError: index out "
        "of range in self; an id past the model's table? check inputs[0].high (input_ids up to",
        (("low: 1, high: 999", "low: 1000, high: 100000"),),
    ),
    Case(
        "low above high",
        "schema",
        "inputs[0].low: must not exceed high",
        (("low: 1, high: 999", "low: 1000, high: 999"),),
    ),
    Case(
        "duplicate input",
        "schema",
        "inputs[1].name: duplicate input name",
        (("name: attention_mask", "name: input_ids"),),
    ),
    Case(
        "duplicate output",
        "schema",
        "outputs[1]: duplicate output name",
        (("outputs: [hidden, pooled]", "outputs: [hidden, hidden]"),),
    ),
    Case(
        "undeclared dim",
        "schema",
        "inputs[1].shape[1]: dynamic dim 'seq' has no min/opt/max",
        (("shape: [batch, sequence], low: 1, high: 1}", "shape: [batch, seq], low: 1, high: 1}"),),
    ),
    Case(
        "unused dim",
        "schema",
        "dims.width: not used by any input shape",
        (("dims:\n", "dims:\n  width: {min: 1, opt: 1, max: 1}\n"),),
    ),
    Case("no outputs", "schema", "outputs: must not be empty", overrides=("outputs=[]",)),
    Case("no inputs", "schema", "inputs: must not be empty", overrides=("inputs=[]",)),
    Case("name with a slash", "schema", "name: string should match pattern", overrides=("name=../escape",)),
    Case(
        "entrypoint without colon",
        "schema",
        "model.entrypoint: string should match",
        overrides=("model.entrypoint=tests.models.tiny",),
    ),
    Case("unknown model source", "schema", "model.source: must be one of", overrides=("model.source=keras",)),
    Case(
        "random samples too few",
        "schema",
        "data.samples.samples: must be at least data.calibration + data.validation = 16",
        overrides=("data.samples.samples=3",),
    ),
    Case(
        "calibration zero",
        "schema",
        "data.calibration: must be a positive integer (got 0)",
        overrides=("data.calibration=0",),
    ),
    Case(
        "unknown precision",
        "schema",
        "validation.tolerances.fp64: unknown key 'fp64'",
        overrides=("validation.tolerances={fp64: {cosine: 0.5}}",),
    ),
    Case(
        "cosine above one",
        "schema",
        "validation.tolerances.fp32.cosine: must be <= 1",
        overrides=("validation.tolerances.fp32.cosine=1.5",),
    ),
    Case(
        "corner batch outside range",
        "schema",
        "validation.corner_batches.max: must lie within dims.batch",
        (("max: 1}", "max: 100}"),),
    ),
    Case(
        "objective batch not measured",
        "schema",
        "selection.objective.batch: must be one of benchmark.batch_sizes",
        overrides=("selection.objective.batch=4",),
    ),
    Case(
        "objective sequence not measured",
        "schema",
        "selection.objective.sequence_length: must be one of",
        overrides=("selection.objective.sequence_length=8",),
    ),
    Case(
        "unknown batch dim",
        "schema",
        "benchmark.batch_dim: 'rows' is not a dynamic dim",
        overrides=("benchmark.batch_dim=rows",),
    ),
    Case(
        "negative lock timeout",
        "schema",
        "output.lock_timeout_s: must be >= 0",
        overrides=("output.lock_timeout_s=-1",),
    ),
    Case("override without =", "schema", "expected dotted.key=value", overrides=("benchmark.batch_sizes",)),
    Case("override into a scalar", "schema", "no such place in the recipe", overrides=("name.first=x",)),
    Case(
        "opset too old",
        "schema",
        "export.onnx.opset: must be >= 13 (got 12)",
        overrides=("export.onnx.opset=12",),
    ),
    Case(
        "text data without tokenizer",
        "schema",
        "data.samples.source: text samples need a huggingface model",
        overrides=("data.samples={source: text, path: {tmp}/s.jsonl}",),
        files=text_file("s.jsonl", b"a sentence\n" * 20),
    ),
    Case(
        "engine compute capability",
        "schema",
        "export.tensorrt.compute_capabilities[0]",
        overrides=(
            "variants.build=[onnx-fp32, tensorrt-rtx-fp32]",
            "export.tensorrt.compute_capabilities=[sm90]",
        ),
    ),
    # ---------------------------------------------------------------- data files
    Case(
        "missing npz",
        "data",
        "data.samples.path: no such data file",
        overrides=("data.samples={source: npz, path: {tmp}/none.npz}",),
    ),
    Case(
        "data path is a folder",
        "data",
        "data.samples.path: not a file",
        overrides=("data.samples={source: npz, path: {tmp}}",),
    ),
    Case(
        "npz not a zip",
        "data",
        "data.samples.path: cannot read",
        (),
        NPZ,
        text_file("d.npz", b"not a zip file"),
    ),
    Case(
        "npz missing an input",
        "data",
        "has no array for input(s) attention_mask",
        (),
        NPZ,
        npz(input_ids=IDS),
    ),
    Case(
        "npz of strings",
        "data",
        "array 'input_ids' holds <U1 values",
        (),
        NPZ,
        npz(input_ids=np.array(["a", "b"]), attention_mask=IDS),
    ),
    Case(
        "npz of objects",
        "data",
        "array 'input_ids' cannot be read",
        (),
        NPZ,
        npz(input_ids=np.array([{"a": 1}, None], dtype=object), attention_mask=IDS),
    ),
    Case(
        "npz 0-d",
        "data",
        "array 'input_ids' has rank 0",
        (),
        NPZ,
        npz(input_ids=np.array(5), attention_mask=IDS),
    ),
    Case(
        "npz empty",
        "data",
        "array 'input_ids' holds no samples",
        (),
        NPZ,
        npz(input_ids=IDS[:0], attention_mask=IDS),
    ),
    Case(
        "npz wrong rank",
        "data",
        "array 'input_ids' has rank 3",
        (),
        NPZ,
        npz(input_ids=IDS[:, :, None], attention_mask=IDS),
    ),
    Case(
        "npz float ids",
        "data",
        "holds float64 values, which do not convert to int64",
        (),
        NPZ,
        npz(input_ids=IDS * 1.5, attention_mask=IDS),
    ),
    Case(
        "npz counts differ",
        "data",
        "the arrays hold different numbers of samples",
        (),
        NPZ,
        npz(input_ids=IDS, attention_mask=IDS[:18]),
    ),
    Case(
        "npz dims beyond max",
        "data",
        "has 100 along axis 1, outside dims.sequence 4..32",
        (),
        NPZ,
        npz(input_ids=np.ones((20, 100), np.int64), attention_mask=IDS),
    ),
    Case(
        "npz too few samples",
        "data",
        "data.calibration: data.calibration (8) + data.validation (8) need 16 samples",
        (),
        NPZ,
        npz(input_ids=IDS[:10], attention_mask=IDS[:10]),
    ),
    Case(
        "npz ids beyond vocabulary",
        "data",
        "data.samples: the model fails on the recipe's samples",
        (),
        NPZ,
        npz(input_ids=IDS * 5000, attention_mask=IDS),
    ),
    Case(
        "npz that is a .npy",
        "data",
        "holds one array, not an .npz archive",
        (),
        NPZ,
        lambda tmp: np.save(tmp / "d.npz", IDS) or (tmp / "d.npz.npy").rename(tmp / "d.npz"),
    ),
    # ---------------------------------------------------------------- model
    Case(
        "module not found",
        "model",
        "model.entrypoint: cannot import module 'no_such_pkg.models'",
        overrides=("model.entrypoint=no_such_pkg.models:make",),
    ),
    Case(
        "module fails to import",
        "model",
        "model.entrypoint: importing 'tests.reliability.broken_import' failed",
        overrides=("model.entrypoint=tests.reliability.broken_import:make",),
    ),
    Case(
        "factory missing",
        "model",
        "has no callable 'nope'",
        overrides=("model.entrypoint=tests.models.tiny:nope",),
    ),
    Case(
        "factory raises",
        "model",
        "model.entrypoint: building the model failed: ValueError: weights file not found",
        overrides=(f"model.entrypoint={BAD}:raises",),
    ),
    Case(
        "factory returns a dict",
        "model",
        "returned dict, not a torch.nn.Module",
        overrides=(f"model.entrypoint={BAD}:not_a_module",),
    ),
    Case(
        "unknown kwarg",
        "model",
        "model.kwargs.depth: 'tests.reliability.bad_models:strict' takes no argument 'depth'",
        overrides=(f"model.entrypoint={BAD}:strict", "model.kwargs={hidden: 64, depth: 3}"),
    ),
    Case(
        "kwarg of the wrong type",
        "model",
        "model.entrypoint: building the model failed: TypeError",
        overrides=("model.kwargs={hidden: sixty-four}",),
    ),
    Case(
        "one output for two",
        "model",
        "outputs: the model returns 1 output(s) but outputs names 2",
        overrides=(f"model.entrypoint={BAD}:one_output",),
    ),
    Case(
        "one output named for two",
        "model",
        "outputs: the model returns 2 output(s) but outputs names 1",
        overrides=("outputs=[pooled]",),
    ),
    Case(
        "empty outputs",
        "model",
        "outputs[1]: the model's output 1 is empty (shape [1, 0])",
        overrides=(f"model.entrypoint={BAD}:empty_output",),
    ),
    Case(
        "an output NaN everywhere",
        "model",
        "outputs[1]: the model's output 'pooled' is NaN/inf everywhere at every shape pre-flight ran",
        overrides=(f"model.entrypoint={BAD}:nan_everywhere",),
    ),
    Case(
        "three outputs for two",
        "model",
        "outputs: the model returns 2 output(s) but outputs names 3",
        overrides=("outputs=[hidden, pooled, logits]",),
    ),
    Case(
        "output names differ",
        "model",
        "outputs[1]: the model has no output 'state' (it returns states, embedding)",
        overrides=(f"model.entrypoint={BAD}:named_outputs", "outputs=[embedding, state]"),
    ),
    Case(
        "0-d output",
        "model",
        "outputs[0]: the model's output 0 is a 0-d tensor",
        overrides=(f"model.entrypoint={BAD}:scalar_output",),
    ),
    Case(
        "nested output",
        "model",
        "outputs[1]: the model's output 1 is a list of 1, not a tensor: outputs must be tensors",
        overrides=(f"model.entrypoint={BAD}:nested_output",),
    ),
    Case(
        "leaves of a nested output named",
        "model",
        "outputs: the model returns 2 output(s) but outputs names 3; its output 1 is a list of 1, not a tensor: "
        "outputs must be tensors, and an item inside one cannot be named; return the items as outputs of "
        "their own (output1_0)",
        overrides=(f"model.entrypoint={BAD}:nested_output", "outputs=[hidden, pooled, extra]"),
    ),
    Case(
        "a None among the outputs, the tensors named",
        "model",
        "outputs: the model returns 3 output(s) but outputs names 2; the model's output 1 is None (nothing an "
        "exporter can return): drop it from what forward returns, or wrap the model",
        overrides=(f"model.entrypoint={BAD}:none_output",),
    ),
    Case(
        "a None among the outputs, named too",
        "model",
        "outputs[1]: the model's output 1 is None (nothing an exporter can return)",
        overrides=(f"model.entrypoint={BAD}:none_output", "outputs=[hidden, nothing, pooled]"),
    ),
    Case(
        "nested dict output",
        "model",
        "outputs[1]: the model's output 'heads' is a tuple of 2, not a tensor: outputs must be tensors, and an "
        "item inside one cannot be named; return the items as outputs of their own (heads0, heads1)",
        overrides=(f"model.entrypoint={BAD}:nested_named_output", "outputs=[hidden, heads]"),
    ),
    Case(
        "item of a nested output named",
        "model",
        "outputs[1]: the model has no output 'heads.0' (it returns hidden, heads): 'heads' is a tuple of 2, "
        "not a tensor: outputs must be tensors, and an item inside one cannot be named",
        overrides=(f"model.entrypoint={BAD}:nested_named_output", "outputs=[hidden, heads.0]"),
    ),
    Case(
        "forward takes fewer inputs",
        "model",
        "inputs[1].name: 'attention_mask' is not a parameter of _OneInput.forward(input_ids)",
        overrides=(f"model.entrypoint={BAD}:one_input",),
    ),
    Case(
        "forward draws random numbers",
        "model",
        "model: the model's outputs change between two runs on the same inputs: hidden (max abs difference",
        overrides=(f"model.entrypoint={BAD}:sampling",),
    ),
    Case(
        "forward takes its inputs grouped",
        "model",
        "inputs[0].name: 'input_ids' is not a parameter of _GroupedInputs.forward(batch): inputs are passed by "
        "name, so name each input after the parameter it feeds; each input is one tensor for one parameter, so a "
        "forward that takes its tensors grouped in a dict, list or tuple needs a wrapper module",
        overrides=(f"model.entrypoint={BAD}:grouped_inputs",),
    ),
    Case(
        "sequence beyond positions",
        "model",
        "dims.sequence.max: the model fails when sequence = 600",
        overrides=("dims.sequence.max=600",),
    ),
    Case(
        "no torchscript file",
        "model",
        "model.path: no such TorchScript file",
        overrides=("model={source: torchscript, path: {tmp}/m.ts}",),
    ),
    Case(
        "torchscript file is garbage",
        "model",
        "model.path: building the model failed",
        overrides=("model={source: torchscript, path: {tmp}/m.ts}",),
        files=text_file("m.ts", b"PK\x03\x04 garbage"),
    ),
    Case(
        "huggingface dir missing",
        "model",
        "model.path: no such model directory",
        overrides=("model={source: huggingface, path: {tmp}/none}",),
    ),
    Case(
        "huggingface package missing",
        "model",
        "model.package: Python package 'no_such_models' is not installed",
        overrides=("model={source: huggingface, package: no_such_models/m}",),
    ),
    Case(
        "huggingface dir without weights",
        "model",
        "model.path: building the model failed",
        overrides=("model={source: huggingface, path: {tmp}}",),
        files=text_file("config.json", b'{"model_type": "bert"}'),
    ),
    # ---------------------------------------------------------------- bert: text data and a real model config
    Case(
        "empty jsonl",
        "data",
        "data.samples.path: ",
        overrides=JSONL,
        files=text_file("s.jsonl", b""),
        recipe=BERT,
        deploy=False,
    ),
    Case(
        "jsonl bad line",
        "data",
        "s.jsonl:2:2: not valid JSON",
        overrides=JSONL,
        files=text_file("s.jsonl", b'{"text": "a"}\n{oops\n'),
        recipe=BERT,
        deploy=False,
    ),
    Case(
        "jsonl missing field",
        "data",
        "data.samples.field: ",
        overrides=JSONL,
        files=text_file("s.jsonl", b'{"txt": "a"}\n'),
        recipe=BERT,
        deploy=False,
    ),
    Case(
        "jsonl null text",
        "data",
        "field 'text' is not a non-empty string",
        overrides=JSONL,
        files=text_file("s.jsonl", b'{"text": null}\n'),
        recipe=BERT,
        deploy=False,
    ),
    Case(
        "text not utf-8",
        "data",
        "s.jsonl:2:7: not UTF-8 text",
        overrides=JSONL,
        files=text_file("s.jsonl", b"hello\nworld \xff\n"),
        recipe=BERT,
        deploy=False,
    ),
    Case(
        "too few sentences",
        "data",
        "need 96 samples, but",
        overrides=JSONL,
        files=text_file("s.jsonl", b"one\ntwo\nthree\n"),
        recipe=BERT,
        deploy=False,
    ),
    Case(
        "bert positions",
        "model",
        "dims.sequence.max: must not exceed the model's max_position_embeddings (512)",
        overrides=("dims.sequence.max=600",),
        recipe=BERT,
        deploy=False,
    ),
    Case(
        "bert output name",
        "model",
        "outputs[1]: the model has no output 'pooler'",
        overrides=("outputs=[last_hidden_state, pooler]",),
        recipe=BERT,
        deploy=False,
    ),
    # ---------------------------------------------------------------- storage: where the output goes
    Case(
        "output root is a file",
        "storage",
        "output.root: {tmp}/out is a file, not a folder",
        files=text_file("out", b"x"),
    ),
    Case(
        "recipe folder is a file",
        "storage",
        "output.root: {tmp}/out/tiny is a file",
        files=lambda tmp: ((tmp / "out").mkdir(), (tmp / "out/tiny").write_text("x")),
    ),
    Case(
        "latest is a folder",
        "storage",
        "output.root: {tmp}/out/tiny/latest is not the store's `latest` link",
        files=lambda tmp: (tmp / "out/tiny/latest").mkdir(parents=True),
    ),
    Case(
        "work folder is a file",
        "storage",
        "output.root: {tmp}/out/tiny/.work is a file",
        files=lambda tmp: ((tmp / "out/tiny").mkdir(parents=True), (tmp / "out/tiny/.work").write_text("x")),
    ),
    Case(
        "output root under a file",
        "storage",
        "output.root: {tmp}/f is a file",
        overrides=("output.root={tmp}/f/out",),
        files=text_file("f", b"x"),
    ),
]


def test_the_table_is_broad() -> None:
    kinds = {k: sum(c.kind == k for c in CASES) for k in ("schema", "data", "model", "storage")}
    assert len(CASES) >= 60 and all(kinds.values()), kinds
    assert len({c.name for c in CASES}) == len(CASES)


def _prepare(case: Case, tmp: Path) -> tuple[str, list[str], Path]:
    """The RECIPE argument, its --set overrides, and the output root that must stay absent."""
    if case.files:
        case.files(tmp)
    recipe = tmp / "recipe.yaml"
    if case.raw is not None:
        recipe.write_bytes(case.raw)
    else:
        text = case.recipe.read_text()
        for old, new in case.replace:
            assert old in text, old
            text = text.replace(old, new)
        recipe.write_text(text)
        if case.recipe == BERT:  # its data path is relative to the recipe's folder
            (tmp / "data").mkdir(exist_ok=True)
            (tmp / "data/sentences.jsonl").write_bytes((ROOT / "recipes/data/sentences.jsonl").read_bytes())
    overrides = [o.replace("{tmp}", str(tmp)) for o in case.overrides]
    root = tmp / "out"
    if not any(o.startswith("output.root=") for o in overrides):
        overrides.append(f"output.root={root}")
    target = case.target.replace("{tmp}", str(tmp)) if case.target else str(recipe)
    return target, sets(*overrides), root


def _tree(root: Path) -> list[Path]:
    return sorted(root.rglob("*")) if root.is_dir() else []


def _check(case: Case, tmp: Path, target: str, result, root: Path, command: str, before: list[Path]) -> None:
    lines = result.stderr.strip().splitlines()
    assert result.returncode == 2, (command, result.returncode, result.stderr[-2000:], result.stdout[-500:])
    assert "Traceback" not in result.stderr
    assert len(lines) == 1, lines
    line = lines[0]
    assert case.expect.replace("{tmp}", str(tmp)) in line, line
    located = re.match(rf"{re.escape(target)}:(\d+):\d+: ", line) or line.startswith(
        ("--set ", f"{target}: ")
    )
    assert located, line
    if case.at:
        text = Path(target).read_bytes().decode("utf-8", "replace").splitlines()
        expected_line = max(i for i, t in enumerate(text, 1) if case.at in t)
        assert line.startswith(f"{target}:{expected_line}:"), (line, expected_line)
    assert _tree(root) == before, "something was written under the output root"


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_bad_input_is_one_located_user_error(case: Case, tmp_path: Path) -> None:
    target, overrides, root = _prepare(case, tmp_path)
    before = _tree(root)
    for command in ("validate", "deploy") if case.deploy else ("validate",):
        result = run_inprocess(command, target, *overrides)
        _check(case, tmp_path, target, result, root, command, before)


@pytest.mark.parametrize(
    "name", ["duplicate top key", "npz of strings", "factory raises", "output root is a file"]
)
def test_bad_input_through_the_real_command(name: str, tmp_path: Path) -> None:
    """The same contract from a child process: what a user or a CI gate sees."""
    case = next(c for c in CASES if c.name == name)
    target, overrides, root = _prepare(case, tmp_path)
    before = _tree(root)
    result = run_cli("deploy", target, *overrides, cwd=tmp_path)
    _check(case, tmp_path, target, result, root, "deploy", before)
