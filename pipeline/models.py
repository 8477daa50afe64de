"""Model sources: a Hugging Face encoder (local dir, packaged dir, or hub id), a torchvision model,
a Python entrypoint `package.module:factory`, or a TorchScript file. Every source yields an nn.Module that
takes the recipe's inputs positionally and returns the recipe's outputs as a tuple, in recipe order."""

from __future__ import annotations

import importlib
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn

from pipeline.errors import RecipeError
from pipeline.recipe import EntrypointSource, HuggingFaceSource, TorchScriptSource, TorchvisionSource
from pipeline.specs import ModelSpec, huggingface_dir, resolve


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


def load_model(spec: ModelSpec) -> LoadedModel:
    """The model as the pipeline runs it: the recipe's inputs positionally in, its outputs as a tuple out."""
    src, recipe_dir = spec.source, spec.recipe_dir
    if isinstance(src, HuggingFaceSource):
        return _load_huggingface(src, spec)
    if isinstance(src, EntrypointSource):
        module_name, _, factory_name = src.entrypoint.partition(":")
        torch.manual_seed(src.seed)
        factory = getattr(importlib.import_module(module_name), factory_name)
        made = factory(**src.kwargs)
        if not isinstance(made, nn.Module):
            raise TypeError(f"'{src.entrypoint}' returned {type(made).__name__}, not a torch.nn.Module")
        return LoadedModel(module=_as_tuple(made).eval())
    if isinstance(src, TorchScriptSource):
        return LoadedModel(module=_as_tuple(torch.jit.load(str(resolve(src.path, recipe_dir)))).eval())
    assert isinstance(src, TorchvisionSource)
    try:
        import torchvision
    except ImportError:
        raise RecipeError(
            "model.source: torchvision is not installed (pip install 'deploy-pipeline[torchvision]')"
        ) from None
    return LoadedModel(module=_as_tuple(torchvision.models.get_model(src.name, weights=src.weights)).eval())


def positional(feeds: dict[str, Any], spec: ModelSpec) -> tuple[torch.Tensor, ...]:
    """Numpy feeds as the positional tensors the wrapped module takes, in the recipe's input order."""
    return tuple(torch.from_numpy(feeds[s.name]) for s in spec.inputs)


def _load_huggingface(src: HuggingFaceSource, spec: ModelSpec) -> LoadedModel:
    import transformers
    from transformers import AutoModel, AutoTokenizer

    transformers.logging.set_verbosity_error()  # its load-time notes and progress bars are not ours to print
    transformers.logging.disable_progress_bar()
    location = huggingface_dir(src, spec.recipe_dir)
    local = Path(location).is_dir()
    if src.offline and not local:
        os.environ.setdefault("HF_HUB_OFFLINE", "1")
    encoder = AutoModel.from_pretrained(
        location, local_files_only=src.offline or local, attn_implementation="eager"
    )
    tokenizer = AutoTokenizer.from_pretrained(location, local_files_only=src.offline or local)
    wrapped = SentenceEncoder(encoder, spec.input_names, list(spec.outputs), src.normalize).eval()
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
