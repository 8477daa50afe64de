"""The folders show the architecture (docs/architecture.md, "Layout of the code"): each package of pipeline/
imports only packages below it in LAYERS, none imports one above it or its neighbour in the same layer, and
the root holds the command line alone. A new import that breaks the order fails here, naming the file."""

from __future__ import annotations

import ast
from pathlib import Path

import pipeline

PACKAGE = Path(pipeline.__file__).parent
LAYERS = (  # lowest first; packages in one layer do not import each other
    ("core",),
    ("toolchain", "recipe"),
    ("check", "inputs"),
    ("report", "runners"),
    ("decide", "bench"),
    ("release",),
    ("stages",),
    ("preflight",),
    ("run", "fleet"),
    ("cli",),
    ("__main__",),
)
RANK = {name: i for i, layer in enumerate(LAYERS) for name in layer}


def imported_packages(path: Path) -> set[str]:
    """The pipeline packages (or root modules) a file imports, at any depth of its code."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] == "pipeline":
            names = [node.module] if node.module != "pipeline" else [f"pipeline.{a.name}" for a in node.names]
        elif isinstance(node, ast.Import):
            names = [a.name for a in node.names if a.name.split(".")[0] == "pipeline"]
        else:
            continue
        found |= {n.split(".")[1] for n in names if n.count(".") >= 1}
    return found


def test_every_package_has_a_layer() -> None:
    here = {p.name for p in PACKAGE.iterdir() if p.is_dir() and (p / "__init__.py").exists()}
    here |= {p.stem for p in PACKAGE.glob("*.py") if p.stem != "__init__"}
    assert here == set(RANK), sorted(here ^ set(RANK))


def test_no_package_imports_one_above_or_beside_it() -> None:
    wrong = []
    for path in sorted(PACKAGE.rglob("*.py")):
        relative = path.relative_to(PACKAGE)
        source = relative.parts[0].removesuffix(".py")
        if source == "__init__":
            continue
        for target in imported_packages(path) - {source}:
            if target in RANK and RANK[target] >= RANK[source]:
                wrong.append(f"pipeline/{relative} imports pipeline.{target}")
    assert not wrong, "\n".join(wrong)


def test_the_check_sees_an_import_upwards(tmp_path: Path) -> None:
    module = tmp_path / "m.py"
    module.write_text("def f():\n    from pipeline.run.deploy import deploy\n    from pipeline import cli\n")
    assert imported_packages(module) == {"run", "cli"}
