"""Model sources: a Hugging Face encoder (local dir, packaged dir, or hub id), a torchvision model,
a Python entrypoint `package.module:factory`, or a TorchScript file. Every source yields an nn.Module that
takes the recipe's inputs positionally and returns the recipe's outputs as a tuple, in recipe order."""

from __future__ import annotations

import functools
import hashlib
import importlib
import importlib.util
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from pydantic import TypeAdapter
from torch import nn

from pipeline.errors import RecipeError
from pipeline.recipe import (
    EntrypointSource,
    HuggingFaceSource,
    ModelSource,
    Recipe,
    TorchScriptSource,
    TorchvisionSource,
)


@dataclass
class LoadedModel:
    module: nn.Module
    tokenizer: Any = None
    config: dict[str, Any] = field(default_factory=dict)  # e.g. hidden_size / num_attention_heads


class SentenceEncoder(nn.Module):
    """A transformers encoder plus the sentence-transformers head: mean pooling over the mask, L2 norm."""

    def __init__(self, encoder: nn.Module, input_names: list[str], outputs: list[str], normalize: bool):
        super().__init__()
        self.encoder = encoder
        self.input_names = input_names
        self.outputs = outputs
        self.normalize = normalize

    def forward(self, *args: torch.Tensor) -> tuple[torch.Tensor, ...]:
        kwargs = dict(zip(self.input_names, args, strict=True))
        hidden = self.encoder(**kwargs).last_hidden_state
        result = {"last_hidden_state": hidden}
        if "sentence_embedding" in self.outputs:
            mask = kwargs["attention_mask"].unsqueeze(-1).to(hidden.dtype)
            pooled = (hidden * mask).sum(dim=1) / mask.sum(dim=1).clamp(min=1e-9)
            result["sentence_embedding"] = (
                nn.functional.normalize(pooled, p=2, dim=1) if self.normalize else pooled
            )
        return tuple(result[name] for name in self.outputs)


def huggingface_dir(source: HuggingFaceSource, recipe_dir: Path) -> str:
    """Where transformers should load from: a local path, a package's shipped copy, or the hub id."""
    if source.path:
        path = Path(source.path)
        return str(path if path.is_absolute() else recipe_dir / path)
    if source.package:
        package, _, sub = source.package.partition("/")
        spec = importlib.util.find_spec(package)
        if spec is None or not spec.submodule_search_locations:
            raise RecipeError(
                f"model.package: Python package '{package}' is not installed (pip install {package.replace('_', '-')})"
            )
        return str(Path(next(iter(spec.submodule_search_locations))) / sub)
    assert source.id
    return source.id


def model_fingerprint(recipe: Recipe, recipe_dir: Path) -> str:
    """Hash of what defines the weights: files of a local model, the source spec for entrypoints (seeded)."""
    return _model_fingerprint(recipe.model.model_dump_json(), str(recipe_dir.resolve()))


@functools.cache
def _model_fingerprint(source_json: str, recipe_dir_text: str) -> str:
    recipe_dir = Path(recipe_dir_text)
    src = TypeAdapter(ModelSource).validate_json(source_json)
    h = hashlib.sha256(src.model_dump_json(exclude={"path", "package", "family"}).encode())
    folder: Path | None = None
    if isinstance(src, HuggingFaceSource):
        location = Path(huggingface_dir(src, recipe_dir))
        folder = location if location.is_dir() else None
    elif isinstance(src, TorchScriptSource):
        h.update(_resolve(src.path, recipe_dir).read_bytes())
    elif isinstance(src, EntrypointSource):
        module = importlib.import_module(src.entrypoint.split(":")[0])
        if getattr(module, "__file__", None):
            h.update(Path(module.__file__).read_bytes())
    if folder is not None:
        for f in sorted(p for p in folder.rglob("*") if p.is_file()):
            h.update(str(f.relative_to(folder)).encode())
            h.update(f.read_bytes())
    return h.hexdigest()


def load_model(recipe: Recipe, recipe_dir: Path) -> LoadedModel:
    src = recipe.model
    names = [s.name for s in recipe.inputs]
    if isinstance(src, HuggingFaceSource):
        return _load_huggingface(src, recipe, recipe_dir, names)
    if isinstance(src, EntrypointSource):
        module_name, _, factory_name = src.entrypoint.partition(":")
        torch.manual_seed(src.seed)
        factory = getattr(importlib.import_module(module_name), factory_name)
        made = factory(**src.kwargs)
        if not isinstance(made, nn.Module):
            raise TypeError(f"'{src.entrypoint}' returned {type(made).__name__}, not a torch.nn.Module")
        return LoadedModel(module=_as_tuple(made).eval())
    if isinstance(src, TorchScriptSource):
        return LoadedModel(module=_as_tuple(torch.jit.load(str(_resolve(src.path, recipe_dir)))).eval())
    assert isinstance(src, TorchvisionSource)
    try:
        import torchvision
    except ImportError:
        raise RecipeError(
            "model.source: torchvision is not installed (pip install 'deploy-pipeline[torchvision]')"
        ) from None
    return LoadedModel(module=_as_tuple(torchvision.models.get_model(src.name, weights=src.weights)).eval())


def _load_huggingface(
    src: HuggingFaceSource, recipe: Recipe, recipe_dir: Path, names: list[str]
) -> LoadedModel:
    import transformers
    from transformers import AutoModel, AutoTokenizer

    transformers.logging.set_verbosity_error()  # its load-time notes and progress bars are not ours to print
    transformers.logging.disable_progress_bar()
    location = huggingface_dir(src, recipe_dir)
    local = Path(location).is_dir()
    if src.offline and not local:
        os.environ.setdefault("HF_HUB_OFFLINE", "1")
    encoder = AutoModel.from_pretrained(
        location, local_files_only=src.offline or local, attn_implementation="eager"
    )
    tokenizer = AutoTokenizer.from_pretrained(location, local_files_only=src.offline or local)
    wrapped = SentenceEncoder(encoder, names, list(recipe.outputs), src.normalize).eval()
    cfg = encoder.config
    config = {
        "hidden_size": cfg.hidden_size,
        "num_attention_heads": cfg.num_attention_heads,
        "model_type": cfg.model_type,
        "max_position_embeddings": getattr(cfg, "max_position_embeddings", None),
    }
    return LoadedModel(module=wrapped, tokenizer=tokenizer, config=config)


class _Tupled(nn.Module):
    def __init__(self, inner: nn.Module):
        super().__init__()
        self.inner = inner

    def forward(self, *args: torch.Tensor) -> tuple[torch.Tensor, ...]:
        out = self.inner(*args)
        if isinstance(out, torch.Tensor):
            return (out,)
        if isinstance(out, dict):
            return tuple(out.values())
        return tuple(out)


def _as_tuple(module: nn.Module) -> nn.Module:
    return _Tupled(module)


def _resolve(path: str, recipe_dir: Path) -> Path:
    p = Path(path)
    return p if p.is_absolute() else recipe_dir / p
