"""Runtime knowledge has one home: the runner modules declare their runtimes (pipeline/core/runtimes.py's
descriptor) and every other module asks a descriptor. A module that matched runtime names as strings would
treat a new runtime wrongly without a word (a provider without "-cuda" in its name read as the CPU)."""

from __future__ import annotations

import ast
from pathlib import Path

import pipeline
from pipeline.core.variants import ENGINE_FLAVOURS
from pipeline.runners.registry import runtimes

PACKAGE = Path(pipeline.__file__).parent
ALLOWED = ("core", "runners")  # where runtimes are declared and described
FRAGMENTS = ("-cuda", "-cpu", "cuda-", "-graph", "-bucketed")  # pieces of runtime names


def _docstrings(tree: ast.AST) -> set[int]:
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            body = node.body
            if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
                found.add(id(body[0].value))
    return found


def runtime_strings(path: Path, names: set[str], base: Path = PACKAGE.parent) -> list[str]:
    """Every string constant in the module (docstrings aside) that is a runtime's name or a piece of one."""
    tree = ast.parse(path.read_text())
    skip = _docstrings(tree)
    hits = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in skip:
            text = node.value
            if text in names or text in FRAGMENTS:
                hits.append(f"{path.relative_to(base)}:{node.lineno}: {text!r}")
    return hits


def test_the_probe_finds_a_runtime_name_where_one_is_written(tmp_path) -> None:
    module = tmp_path / "pipeline" / "m.py"
    module.parent.mkdir()
    module.write_text(
        '"""torch-cuda in a docstring is prose."""\nGPU = "-cuda" in runtime\nX = "onnxruntime-cpu"\n'
    )
    hits = runtime_strings(module, {"onnxruntime-cpu"}, base=tmp_path)
    assert sorted(h.split(": ", 1)[1] for h in hits) == ["'-cuda'", "'onnxruntime-cpu'"]


def test_no_module_outside_core_and_the_runners_matches_runtime_names() -> None:
    # an engine's runtime is named for its flavour; the flavour names the builder too (variant names, build
    # stages, install hints), which is no runtime knowledge
    names = set(runtimes()) - set(ENGINE_FLAVOURS)
    assert {"onnxruntime-cpu", "torch-cuda", "torch-aoti-cuda-graph"} <= names
    hits = []
    for path in sorted(PACKAGE.rglob("*.py")):
        if path.relative_to(PACKAGE).parts[0] in ALLOWED:
            continue
        hits += runtime_strings(path, names)
    assert not hits, "\n".join(hits)
