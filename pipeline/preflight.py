"""Checks that touch the world (files exist, optional packages installed), run right after the schema and
before any work, so that a deploy never stops half-way on something it could have known up front."""

from __future__ import annotations

import importlib.util
from pathlib import Path

from pipeline.errors import Problem, RecipeError
from pipeline.recipe import (
    EntrypointSource,
    HuggingFaceSource,
    NpzData,
    TextData,
    TorchScriptSource,
    TorchvisionSource,
)
from pipeline.recipe_loader import LoadedRecipe


def _installed(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        return False


def _model_problems(loaded: LoadedRecipe, base: Path) -> list[Problem]:
    src, out = loaded.recipe.model, []
    if isinstance(src, HuggingFaceSource):
        if src.path and not (base / src.path).is_dir():
            out.append(loaded.problem("model.path", f"no such model directory: {base / src.path}"))
        elif src.package and not src.path:
            package, _, sub = src.package.partition("/")
            spec = importlib.util.find_spec(package) if _installed(package) else None
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
        if not _installed("transformers"):
            out.append(
                loaded.problem("model.source", "transformers is not installed (pip install transformers)")
            )
    elif isinstance(src, TorchScriptSource) and not (base / src.path).is_file():
        out.append(loaded.problem("model.path", f"no such TorchScript file: {base / src.path}"))
    elif isinstance(src, EntrypointSource) and not _installed(src.entrypoint.split(":")[0]):
        out.append(
            loaded.problem("model.entrypoint", f"cannot import module '{src.entrypoint.split(':')[0]}'")
        )
    elif isinstance(src, TorchvisionSource) and not _installed("torchvision"):
        out.append(
            loaded.problem(
                "model.source", "torchvision is not installed (pip install 'deploy-pipeline[torchvision]')"
            )
        )
    return out


def _package_problems(loaded: LoadedRecipe) -> list[Problem]:
    recipe, out = loaded.recipe, []
    if not _installed("onnxruntime"):
        out.append(
            loaded.problem(
                "variants.build",
                "onnxruntime is not installed (pip install 'deploy-pipeline[cpu]', or '[gpu]' on a CUDA machine)",
            )
        )
    if (
        "onnx-int8" in recipe.variants.build
        and recipe.export.int8.quantizer == "modelopt"
        and not _installed("modelopt")
    ):
        out.append(
            loaded.problem(
                "export.int8.quantizer",
                "NVIDIA ModelOpt is not installed (pip install nvidia-modelopt, without its [onnx] extra)",
            )
        )
    if any(v.startswith(("tensorrt-", "engine-")) for v in recipe.variants.build):
        from pipeline.stages.tensorrt import preflight_problems

        out += [loaded.problem(key, message) for key, message in preflight_problems(recipe)]
    return out


def check(loaded: LoadedRecipe) -> None:
    """Raise RecipeError listing everything this machine lacks for the recipe."""
    base = loaded.path.parent
    problems = _model_problems(loaded, base)
    samples = loaded.recipe.data.samples
    if isinstance(samples, TextData | NpzData):
        path = Path(samples.path) if Path(samples.path).is_absolute() else base / samples.path
        if not path.is_file():
            problems.append(loaded.problem("data.samples.path", f"no such data file: {path}"))
    problems += _package_problems(loaded)
    if problems:
        raise RecipeError(problems=problems)
