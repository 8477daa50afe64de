"""Runner classes, structurally: no attribute a constructor sets may hide a method of its class.

The CUDA-graph runner once stored its loader as `self._load` while also defining a method `_load`; on the GPU
every call then reached the loader ("takes 1 positional argument but 3 were given"), and no CPU test runs that
runner. This check reads every runner's __init__ so the class of mistake fails here, on any machine.
"""

from __future__ import annotations

import ast
import importlib
import inspect
import pkgutil
import textwrap

import pipeline.runners
from pipeline.runners.base import Runner


def _runner_classes() -> list[type[Runner]]:
    for info in pkgutil.iter_modules(pipeline.runners.__path__):
        importlib.import_module(f"pipeline.runners.{info.name}")
    found, todo = [], list(Runner.__subclasses__())
    while todo:
        cls = todo.pop()
        found.append(cls)
        todo += cls.__subclasses__()
    return [c for c in found if c.__module__.startswith("pipeline.")]


def _self_attributes(cls: type) -> set[str]:
    """Names assigned as self.<name> in the class's own __init__."""
    init = cls.__dict__.get("__init__")
    if init is None:
        return set()
    tree = ast.parse(textwrap.dedent(inspect.getsource(init)))
    names = set()
    for node in ast.walk(tree):
        store = isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store)
        if store and isinstance(node.value, ast.Name) and node.value.id == "self":
            names.add(node.attr)
    return names


def test_every_runner_module_is_seen() -> None:
    names = {c.__name__ for c in _runner_classes()}
    assert {"OrtCudaGraphRunner", "OnnxRuntimeRunner", "Pt2Runner"} <= names, names


def test_no_constructor_attribute_hides_a_method() -> None:
    clashes = []
    for cls in _runner_classes():
        for name in _self_attributes(cls):
            member = inspect.getattr_static(cls, name, None)
            if inspect.isfunction(member) or isinstance(member, (staticmethod, classmethod, property)):
                clashes.append(f"{cls.__module__}.{cls.__name__}: self.{name} hides a method")
    assert not clashes, clashes
