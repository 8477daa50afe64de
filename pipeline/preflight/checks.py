"""Checks that touch the world (files exist, optional packages installed), run right after the schema and
before any work, so that a deploy never stops half-way on something it could have known up front."""

from __future__ import annotations

import importlib
import importlib.util
from pathlib import Path

from pipeline.core.errors import Problem, RecipeError, did_you_mean
from pipeline.core.packages import installed
from pipeline.core.variants import parse
from pipeline.preflight.model_child import Findings, check_model
from pipeline.recipe import (
    EntrypointSource,
    HuggingFaceSource,
    NpzData,
    TextData,
    TorchScriptSource,
    TorchvisionSource,
)
from pipeline.recipe.loader import LoadedRecipe

PACKAGE = Path(__file__).resolve().parent.parent  # the pipeline's own code, wherever it is installed


def _model_problems(loaded: LoadedRecipe, base: Path) -> list[Problem]:
    src, out = loaded.recipe.model, []
    if isinstance(src, HuggingFaceSource):
        if src.path and not (base / src.path).is_dir():
            out.append(loaded.problem("model.path", f"no such model directory: {base / src.path}"))
        elif src.package and not src.path:
            package, _, sub = src.package.partition("/")
            spec = importlib.util.find_spec(package) if installed(package) else None
            if spec is None:
                out.append(
                    loaded.problem(
                        "model.package",
                        f"Python package '{package}' is not installed (pip install {package.replace('_', '-')})",
                    )
                )
            elif not (Path(next(iter(spec.submodule_search_locations))) / sub / "config.json").is_file():
                out.append(
                    loaded.problem(
                        "model.package", f"package '{package}' has no model folder '{sub}' with a config.json"
                    )
                )
        elif src.id and not src.path and not src.package and src.offline:
            from huggingface_hub import try_to_load_from_cache

            if not isinstance(try_to_load_from_cache(src.id, "config.json"), str):
                out.append(
                    loaded.problem(
                        "model.id",
                        f"'{src.id}' is not in the local Hugging Face cache and model.offline is true (set model.offline: false to download it)",
                    )
                )
        if not installed("transformers"):
            out.append(
                loaded.problem("model.source", "transformers is not installed (pip install transformers)")
            )
    elif isinstance(src, TorchScriptSource) and not (base / src.path).is_file():
        out.append(loaded.problem("model.path", f"no such TorchScript file: {base / src.path}"))
    elif isinstance(src, TorchvisionSource) and not installed("torchvision"):
        out.append(
            loaded.problem(
                "model.source", "torchvision is not installed (pip install 'deploy-pipeline[torchvision]')"
            )
        )
    return out


def _package_problems(loaded: LoadedRecipe) -> list[Problem]:
    recipe, out = loaded.recipe, []
    if not installed("onnxruntime"):
        out.append(
            loaded.problem(
                "variants.build",
                "onnxruntime is not installed (pip install 'deploy-pipeline[cpu]', or '[gpu]' on a CUDA machine)",
            )
        )
    if recipe.tracking.mlflow is not None and not installed("mlflow"):
        out.append(
            loaded.problem(
                "tracking.mlflow", "mlflow is not installed (pip install 'deploy-pipeline[mlflow]')"
            )
        )
    if "server" in recipe.benchmark.scenarios and not installed("mlperf_loadgen"):
        out.append(
            loaded.problem(
                "benchmark.scenarios",
                "the server scenario runs on MLPerf LoadGen, which is not installed "
                "(pip install 'deploy-pipeline[load]')",
            )
        )
    if (
        "server" in recipe.benchmark.scenarios
        and recipe.benchmark.server.through == "triton"
        and not installed("pytriton")
    ):
        out.append(
            loaded.problem(
                "benchmark.server.through",
                "triton needs PyTriton, which is not installed (pip install 'deploy-pipeline[serve]')",
            )
        )
    out += _runtime_problems(loaded)
    if any(parse(v).format == "engine" for v in recipe.variants.build):
        from pipeline.stages.tensorrt import preflight_problems

        out += [loaded.problem(key, message) for key, message in preflight_problems(recipe)]
    return out


def _runtime_problems(loaded: LoadedRecipe) -> list[Problem]:
    """Each runtime the recipe lists is one a runner module declares (pipeline/runners/registry.py), and a CPU
    runtime is installed: it would run here, so a missing package is the user's to install, not a row silently
    absent. GPU runtimes on a host without one are reported as not run, as ever."""
    from pipeline.runners.registry import runtimes

    recipe, out = loaded.recipe, []
    lists = (
        ("benchmark.runtimes", recipe.benchmark.runtimes or []),
        ("selection.runtimes", recipe.selection.runtimes),
    )
    if not any(listed for _, listed in lists):
        return out  # nothing to look up: the runner modules are not imported for nothing
    known = runtimes()
    for key, listed in lists:
        for i, name in enumerate(listed):
            found = known.get(name)
            if found is None:
                close = did_you_mean(name, known)
                hint = f": did you mean '{close}'?" if close else ""
                out.append(
                    loaded.problem(
                        f"{key}[{i}]", f"unknown runtime '{name}'{hint} (known: {', '.join(known)})"
                    )
                )
            elif not found.on_gpu and found.package and not installed(found.package):
                how = f" ({found.install})" if found.install else ""
                out.append(
                    loaded.problem(
                        f"{key}[{i}]", f"{name} needs {found.package}, which is not installed{how}"
                    )
                )
    return out


def _root_problems(loaded: LoadedRecipe) -> list[Problem]:
    """The output root, the recipe's folder in it and the store's own entries there are what the store
    makes of them (or do not exist yet): a file where a folder goes is the user's to move."""
    root = Path(loaded.recipe.output.root)
    base = root / loaded.recipe.name
    mixed = _code_problem(base.resolve())
    if mixed:
        return [loaded.problem("output.root", mixed)]
    for path in [*reversed(root.parents), root, base, base / ".work", base / ".cache"]:
        if path.exists() and not path.is_dir():
            return [loaded.problem("output.root", f"{path} is a file, not a folder")]
    latest = base / "latest"
    if latest.exists() and not latest.is_symlink():
        return [loaded.problem("output.root", f"{latest} is not the store's `latest` link; move it away")]
    if (base / ".deploy.lock").is_dir():
        return [loaded.problem("output.root", f"{base / '.deploy.lock'} is a folder, not the lock file")]
    return []


def _code_problem(base: Path) -> str | None:
    """The store folder must lie apart from the pipeline's own code: versions, work folders and caches written
    in the package, or in a folder that holds it, would be mixed into the code (and shipped with it)."""
    if base == PACKAGE or PACKAGE in base.parents:
        return f"{base} is inside the pipeline's own package folder {PACKAGE}; versions written there would be mixed into the code (choose a root outside it)"
    if base in PACKAGE.parents:
        return f"{base} holds the pipeline's own package folder {PACKAGE}; versions written there would be mixed into the code (choose a root outside it)"
    return None


def check(loaded: LoadedRecipe) -> dict[str, str]:
    """Raise RecipeError listing, in one pass, every problem the recipe has on this machine: the cross-field
    problems the loader deferred, the output root, the model (built and run once), the data, the packages.
    Returns each output's kind as the run found it (accuracy.output_kind; empty where the model did not run),
    which decides how the deploy gates it."""
    from pipeline.preflight.data_check import sample_file_problems

    base = loaded.path.parent
    problems = list(loaded.deferred) + _root_problems(loaded)
    static = _model_problems(loaded, base)
    samples = loaded.recipe.data.samples
    data_problems: list[Problem] = []
    if isinstance(samples, TextData | NpzData):
        path = Path(samples.path) if Path(samples.path).is_absolute() else base / samples.path
        if not path.is_file():
            what = "not a file" if path.exists() else "no such data file"
            data_problems.append(loaded.problem("data.samples.path", f"{what}: {path}"))
        else:
            data_problems += sample_file_problems(loaded, path)
    code = _code_findings(loaded, data_ok=not data_problems) if not static else Findings()
    problems += static + code.entrypoint + data_problems + _package_problems(loaded) + code.model
    if problems:
        raise RecipeError(problems=problems)
    return code.outputs


def _code_findings(loaded: LoadedRecipe, data_ok: bool) -> Findings:
    """What running the model's code finds, in a child process bounded by model.build_timeout_s: the entrypoint's
    module imported, then, when the recipe is consistent (building the model needs it), the model built and
    run (pipeline/preflight/model_check.py)."""
    build = not loaded.deferred
    if not build and not isinstance(loaded.recipe.model, EntrypointSource):
        return Findings()
    return check_model(loaded, data_ok, build)
