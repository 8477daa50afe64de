"""Model sources: a Hugging Face encoder (local dir, packaged dir, or hub id), a torchvision model,
a Python entrypoint `package.module:factory`, or a TorchScript file. Every source yields an nn.Module that
takes the recipe's inputs positionally and returns the recipe's outputs as a tuple, in recipe order.

The user's module is called with the recipe's inputs by name (`forward(input_ids=..., attention_mask=...)`),
because a Hugging Face model's second parameter is rarely the recipe's second input (GPT-2 takes the KV cache
there); positionally only where `forward` names no parameters (`*args`) or the model is a TorchScript file.
Dict outputs (a ModelOutput) are picked by the recipe's output names, so a model may return more than it
deploys. Random initialisation is seeded for every source, so that every process that builds the model (the
reference, the lane worker, a child) builds the same weights; `weights_digest` is what each one checks."""

from __future__ import annotations

import contextlib
import hashlib
import importlib
import inspect
import os
import random
import sys
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from pipeline.core.errors import RecipeError
from pipeline.core.user_code import contained
from pipeline.inputs.specs import ModelSpec, huggingface_dir, resolve
from pipeline.recipe import EntrypointSource, HuggingFaceSource, TorchScriptSource, TorchvisionSource


class BindingError(RecipeError):
    """The recipe's inputs cannot be bound to the model's parameters; `key` is the recipe key to blame."""

    def __init__(self, key: str, message: str):
        super().__init__(message)
        self.key = key


@dataclass
class LoadedModel:
    module: nn.Module
    tokenizer: Any = None
    config: dict[str, Any] = field(default_factory=dict)  # e.g. hidden_size / num_attention_heads
    _digest: str | None = None

    def weights_digest(self) -> str:
        """sha256 of every parameter and buffer (names, dtypes, shapes, bytes): which weights this process built.
        Computed once per process; the exports record it and validation compares it with the reference's."""
        if self._digest is None:
            self._digest = weights_digest(self.module)
        return self._digest


def weights_digest(module: nn.Module) -> str:
    h = hashlib.sha256()
    for name, tensor in sorted(module.state_dict(keep_vars=False).items()):
        if not isinstance(tensor, torch.Tensor):
            continue
        data = tensor.detach().to("cpu").contiguous()
        h.update(f"{name}:{data.dtype}:{tuple(data.shape)};".encode())
        if data.numel():
            h.update(data.reshape(-1).view(torch.uint8).numpy().tobytes())
    return h.hexdigest()


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
            result["sentence_embedding"] = mean_pool(hidden, kwargs["attention_mask"], self.normalize)
        return tuple(result[name] for name in self.outputs)


def mean_pool(hidden: torch.Tensor, mask: torch.Tensor, normalize: bool) -> torch.Tensor:
    """sentence-transformers' sentence embedding: the mean over the mask's tokens, L2-normalized if asked; one
    definition for the padded model and the packed one (pipeline/inputs/packed_model.py)."""
    weights = mask.unsqueeze(-1).to(hidden.dtype)
    pooled = (hidden * weights).sum(dim=1) / weights.sum(dim=1).clamp(min=1e-9)
    return nn.functional.normalize(pooled, p=2, dim=1) if normalize else pooled


def load_model(spec: ModelSpec) -> LoadedModel:
    """The model as the pipeline runs it: the recipe's inputs positionally in, its outputs as a tuple out.
    Importing the user's module and calling its factory run the user's code: a sys.exit or KeyboardInterrupt
    of its own is raised as UserCodeExit, which its caller reports as that code's failure."""
    with contained():
        return _load_model(spec)


def _load_model(spec: ModelSpec) -> LoadedModel:
    src, recipe_dir = spec.source, spec.recipe_dir
    if isinstance(src, HuggingFaceSource):
        return _load_huggingface(src, spec)
    if isinstance(src, EntrypointSource):
        module_name, _, factory_name = src.entrypoint.partition(":")
        factory = getattr(importlib.import_module(module_name), factory_name)
        with _seeded(src.seed):
            made = factory(**src.kwargs)
        if not isinstance(made, nn.Module):
            raise TypeError(f"'{src.entrypoint}' returned {type(made).__name__}, not a torch.nn.Module")
        _quiet_transformers()
        return LoadedModel(module=Bound(made, spec, by_name=True).eval(), config=_hf_config(made))
    if isinstance(src, TorchScriptSource):
        scripted = torch.jit.load(str(resolve(src.path, recipe_dir)))
        return LoadedModel(module=Bound(scripted, spec, by_name=False).eval())
    assert isinstance(src, TorchvisionSource)
    torchvision = import_torchvision()
    with _seeded(src.seed):
        made = torchvision.models.get_model(src.name, weights=src.weights)
    return LoadedModel(module=Bound(made, spec, by_name=True).eval())


def _quiet_transformers() -> None:
    """A factory that built a transformers model gets the quiet the hub loader sets: transformers' notes are not
    ours to print, and torch.jit.trace reads every attribute of the model, so its `loss_function` property
    warned of an unrecognized `loss_type` over the live display of every deploy of such a model."""
    if "transformers" in sys.modules:
        sys.modules["transformers"].logging.set_verbosity_error()


@contextlib.contextmanager
def _seeded(seed: int) -> Iterator[None]:
    """Random initialisation from `seed` (torch on every device, numpy, random), without changing the caller's
    random state: the same seed gives the same weights in every process that builds the model."""
    with torch.random.fork_rng(devices=[]):
        state = np.random.get_state(), random.getstate()
        torch.manual_seed(seed)
        np.random.seed(seed)
        random.seed(seed)
        try:
            yield
        finally:
            np.random.set_state(state[0])
            random.setstate(state[1])


def import_torchvision() -> Any:
    """torchvision, or a user error that says what to install: a torchvision built for another torch fails at
    import with 'operator torchvision::nms does not exist', which names neither package."""
    try:
        import torchvision
    except ImportError:
        raise RecipeError(
            "model.source: torchvision is not installed (pip install 'deploy-pipeline[torchvision]')"
        ) from None
    except RuntimeError as exc:
        from pipeline.core.packages import package_version

        torch_version = torch.__version__.split("+")[0]
        major, minor = (int(x) for x in torch_version.split(".")[:2])
        wanted = f"0.{minor + 15}" if major == 2 else "the release matching it"
        build = "cpu" if torch.version.cuda is None else f"cu{torch.version.cuda.replace('.', '')}"
        found = package_version("torchvision")
        raise RecipeError(
            f"torchvision{f' {found}' if found else ''} does not match torch {torch.__version__} "
            f"({str(exc).strip().splitlines()[0]}); install the torchvision built for it: "
            f"pip install 'torchvision=={wanted}.*' --index-url https://download.pytorch.org/whl/{build}"
        ) from None
    return torchvision


def _hf_config(module: nn.Module) -> dict[str, Any]:
    """What the optimizers and the data read of a transformers model's config (empty for other modules)."""
    cfg = getattr(module, "config", None)
    if cfg is None or not hasattr(cfg, "to_dict"):
        return {}
    found = {
        "hidden_size": getattr(cfg, "hidden_size", None),
        "num_attention_heads": getattr(cfg, "num_attention_heads", None),
        "model_type": getattr(cfg, "model_type", None),
        "max_position_embeddings": getattr(cfg, "max_position_embeddings", None),
        "vocab_size": getattr(cfg, "vocab_size", None),
        "type_vocab_size": getattr(cfg, "type_vocab_size", None),
    }
    return {k: v for k, v in found.items() if v is not None}


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
    with _seeded(src.seed):
        encoder = AutoModel.from_pretrained(
            location, local_files_only=src.offline or local, attn_implementation="eager"
        )
    keyword_binding(encoder, spec)  # the recipe's inputs are passed by name: each must be a parameter
    tokenizer = AutoTokenizer.from_pretrained(location, local_files_only=src.offline or local)
    wrapped = SentenceEncoder(encoder, spec.input_names, list(spec.outputs), src.normalize).eval()
    return LoadedModel(module=wrapped, tokenizer=tokenizer, config=_hf_config(encoder))


class Bound(nn.Module):
    """The user's module behind the pipeline's calling convention: the recipe's inputs positionally in (what
    tracers and exporters hand a module), passed on by name where `forward` names them; the recipe's outputs
    as a tuple out, picked by name from a dict or ModelOutput. `inner` is the user's module, so module paths
    (INT8 patterns) read `inner.<path>`."""

    def __init__(self, inner: nn.Module, spec: ModelSpec, by_name: bool):
        super().__init__()
        self.inner = inner
        self.input_names = spec.input_names
        self.output_names = list(spec.outputs)
        self.by_name = by_name and keyword_binding(inner, spec)

    def forward(self, *args: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return pick_outputs(self.raw(*args), self.output_names)

    def raw(self, *args: torch.Tensor) -> Any:
        """What the user's module returns, as it returns it (pre-flight reads its names and types)."""
        if self.by_name:
            return self.inner(**dict(zip(self.input_names, args, strict=True)))
        return self.inner(*args)


def pick_outputs(out: Any, names: list[str]) -> tuple[Any, ...]:
    """The model's return value as the recipe's outputs: a tensor alone, a dict's entries by name (all of
    them, in its order, when it lacks one: pre-flight names what is missing), a sequence as it is."""
    if isinstance(out, torch.Tensor):
        return (out,)
    if isinstance(out, Mapping):
        if all(n in out for n in names):
            return tuple(out[n] for n in names)
        return tuple(out.values())
    return tuple(out)


def parameters_of(module: nn.Module) -> list[inspect.Parameter] | None:
    """forward's parameters, or None when it has no names to bind to (`*args`, or no Python signature)."""
    try:
        params = list(inspect.signature(module.forward).parameters.values())
    except (TypeError, ValueError):
        return None
    named = [p for p in params if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)]
    return named or None


def _keywords_only(module: nn.Module) -> bool:
    """Whether forward takes only `**kwargs`: the inputs can only be passed by name (and the model reads the
    names it needs); a forward with `*args` too keeps its positional call."""
    try:
        kinds = {p.kind for p in inspect.signature(module.forward).parameters.values()}
    except (TypeError, ValueError):
        return False
    return kinds == {inspect.Parameter.VAR_KEYWORD}


def keyword_binding(module: nn.Module, spec: ModelSpec) -> bool:
    """True when the recipe's inputs are passed by name (forward names them, or takes only `**kwargs`); False
    when forward names no parameters, or takes one and the recipe has one input (nothing to mix up). Raises a
    BindingError naming the recipe input (or the parameter) that does not fit."""
    params = parameters_of(module)
    if params is None:
        return _keywords_only(module)
    if len(params) == 1 and len(spec.inputs) == 1:  # one input, one parameter (nn.Sequential's `input`)
        return False
    names = {p.name for p in params}
    owner = f"{type(module).__name__}.forward({', '.join(p.name for p in params)})"
    # Fewer parameters than inputs, none of them named by the recipe: forward most often takes its tensors
    # grouped (a data loader's batch as a dict or tuple), which renaming the inputs cannot fix.
    grouped = (
        "; each input is one tensor for one parameter, so a forward that takes its tensors grouped in a dict, "
        "list or tuple needs a wrapper module whose forward takes each tensor by name and groups them"
        if len(params) < len(spec.inputs) and not names & set(spec.input_names)
        else ""
    )
    for i, spec_input in enumerate(spec.inputs):
        if spec_input.name not in names:
            raise BindingError(
                f"inputs[{i}].name",
                f"'{spec_input.name}' is not a parameter of {owner}: inputs are passed by name, so name "
                f"each input after the parameter it feeds{grouped}",
            )
    given = set(spec.input_names)
    for p in params:
        if p.default is p.empty and p.name not in given:
            raise BindingError(
                "inputs", f"{owner} needs '{p.name}', which no recipe input names (add it to inputs)"
            )
    return True
