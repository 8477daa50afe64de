"""Model factories that go wrong the ways a user's entrypoint can: each must be a located user error."""

from __future__ import annotations

import torch
from torch import nn

from tests.models.tiny import TinyEncoder


def raises(**kwargs: int) -> nn.Module:
    raise ValueError("weights file not found")


def not_a_module(**kwargs: int) -> object:
    return {"hidden": 64}


def strict(hidden: int = 64, layers: int = 2) -> nn.Module:
    return TinyEncoder(hidden=hidden, layers=layers)


class _Wrapping(nn.Module):
    """A small real encoder inside a forward that goes wrong in one way of its own."""

    def __init__(self) -> None:
        super().__init__()
        self.inner = TinyEncoder(hidden=32, layers=1)


class _Single(_Wrapping):
    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        return self.inner(input_ids, attention_mask)[1]


def one_output(**kwargs: int) -> nn.Module:
    return _Single()


class _Named(_Wrapping):
    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> dict[str, torch.Tensor]:
        hidden, pooled = self.inner(input_ids, attention_mask)
        return {"states": hidden, "embedding": pooled}


def named_outputs(**kwargs: int) -> nn.Module:
    return _Named()


class _Scalar(_Wrapping):
    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> tuple[torch.Tensor, ...]:
        hidden, pooled = self.inner(input_ids, attention_mask)
        return hidden.sum(), pooled


def scalar_output(**kwargs: int) -> nn.Module:
    return _Scalar()


class _Nested(_Wrapping):
    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> tuple:
        hidden, pooled = self.inner(input_ids, attention_mask)
        return hidden, [pooled]


def nested_output(**kwargs: int) -> nn.Module:
    return _Nested()


class _WithNone(_Wrapping):
    """As a transformers model returns with return_dict=False: an output it did not compute is None."""

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> tuple:
        hidden, pooled = self.inner(input_ids, attention_mask)
        return hidden, None, pooled


def none_output(**kwargs: int) -> nn.Module:
    return _WithNone()


class _NestedNamed(_Wrapping):
    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> dict:
        hidden, pooled = self.inner(input_ids, attention_mask)
        return {"hidden": hidden, "heads": (pooled, 2 * pooled)}


def nested_named_output(**kwargs: int) -> nn.Module:
    return _NestedNamed()


class _OneInput(_Wrapping):
    def forward(self, input_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return self.inner(input_ids, torch.ones_like(input_ids))


def one_input(**kwargs: int) -> nn.Module:
    return _OneInput()


class _Sampling(_Wrapping):
    """Per-token states with noise drawn on every call, as a VAE's reparameterized sample is."""

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> tuple[torch.Tensor, ...]:
        hidden, pooled = self.inner(input_ids, attention_mask)
        return hidden + torch.randn_like(hidden), pooled


def sampling(**kwargs: int) -> nn.Module:
    return _Sampling()


class _GroupedInputs(_Wrapping):
    """A data loader's batch as one argument: the recipe's two tensors have no parameters of their own."""

    def forward(self, batch: dict[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
        return self.inner(batch["input_ids"], batch["attention_mask"])


def grouped_inputs(**kwargs: int) -> nn.Module:
    return _GroupedInputs()


class _Empty(_Wrapping):
    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> tuple[torch.Tensor, ...]:
        hidden, pooled = self.inner(input_ids, attention_mask)
        return hidden, pooled[:, :0]


def empty_output(**kwargs: int) -> nn.Module:
    return _Empty()


def per_process(**kwargs: int) -> nn.Module:
    """Weights that depend on the process that builds the model (a factory seeding itself from its pid, or
    reading a file another process rewrites): the lane worker's export is of another model."""
    import os

    model = TinyEncoder(hidden=32, layers=1)
    with torch.no_grad():
        model.embed.weight.add_(os.getpid() % 97)
    return model


# ---------------------------------------------------------------- hostile code: exits, hangs, crashes, prints
# Each must end the tool with a message and the exit code that says what happened (tests/reliability/
# test_user_code.py), never with the model's own exit code, silence, or a stuck process.


def exits(**kwargs: int) -> nn.Module:
    import sys

    sys.exit(0)


def interrupts(**kwargs: int) -> nn.Module:
    raise KeyboardInterrupt


def hard_exit(**kwargs: int) -> nn.Module:
    import os

    os._exit(7)


def segfault(**kwargs: int) -> nn.Module:
    import ctypes

    ctypes.string_at(0)
    return TinyEncoder(hidden=32, layers=1)


def hangs(**kwargs: int) -> nn.Module:
    """Never returns; with BAD_MODEL_MARKER set, first writes its pid there (the test then knows it runs)."""
    import os
    import time

    marker = os.environ.get("BAD_MODEL_MARKER")
    if marker:
        with open(marker, "w") as f:
            f.write(str(os.getpid()))
    while True:
        time.sleep(1)


class _ExitsWhenTraced(_Wrapping):
    """Runs eagerly (pre-flight passes), calls sys.exit(0) while TorchScript traces it."""

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> tuple[torch.Tensor, ...]:
        if torch.jit.is_tracing():
            import sys

            sys.exit(0)
        return self.inner(input_ids, attention_mask)


def exits_when_traced(**kwargs: int) -> nn.Module:
    return _ExitsWhenTraced()


class _InterruptsOnBatches(_Wrapping):
    """Runs eagerly where pre-flight runs it (batch 1 at every sequence length, batch 2 at the shortest), raises
    KeyboardInterrupt on a longer eager batch (validation's opt corner, 2 x 16), exports cleanly (tracing and
    exporting are not eager)."""

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> tuple[torch.Tensor, ...]:
        exporting = torch.jit.is_tracing() or torch.compiler.is_compiling() or torch.compiler.is_exporting()
        if input_ids.shape[0] > 1 and input_ids.shape[1] > 4 and not exporting:  # 4: tiny.yaml's sequence min
            raise KeyboardInterrupt
        return self.inner(input_ids, attention_mask)


def interrupts_on_batches(**kwargs: int) -> nn.Module:
    return _InterruptsOnBatches()


class _Chatty(_Wrapping):
    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> tuple[torch.Tensor, ...]:
        print("chatty: forward")
        return self.inner(input_ids, attention_mask)


def chatty(**kwargs: int) -> nn.Module:
    """Prints to stdout every way code can: print, a write to fd 1, C stdio (buffered until exit), at exit."""
    import atexit
    import ctypes
    import os

    print("chatty: factory {")
    os.write(1, b"chatty: fd 1\n")
    ctypes.CDLL(None).puts(b"chatty: C stdio")
    atexit.register(print, "chatty: atexit")
    return _Chatty()


class _NotFinite(_Wrapping):
    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> tuple[torch.Tensor, ...]:
        hidden, pooled = self.inner(input_ids, attention_mask)
        return hidden, torch.log(pooled - pooled.mean())  # the log of a negative number: NaN (about half)


def not_finite(**kwargs: int) -> nn.Module:
    return _NotFinite()


class _NanEverywhere(_Wrapping):
    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> tuple[torch.Tensor, ...]:
        hidden, pooled = self.inner(input_ids, attention_mask)
        return hidden, torch.full_like(pooled, float("nan"))


def nan_everywhere(**kwargs: int) -> nn.Module:
    return _NanEverywhere()


class _Stepwise(nn.Module):
    """A recurrence written as a Python loop over the sequence: every exporter unrolls it at the length it saw."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(1000, 16)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        x = self.embed(input_ids) * attention_mask.unsqueeze(-1)
        state = torch.zeros_like(x[:, 0])
        for t in range(input_ids.shape[1]):
            state = torch.tanh(state + x[:, t])
        return state


def stepwise(**kwargs: int) -> nn.Module:
    torch.manual_seed(0)
    return _Stepwise()


class _Unexportable(nn.Module):
    """A branch on a value (torch.export cannot trace it) and a histogram (the TorchScript-based exporter has no
    ONNX form of aten::histc): neither exporter makes a graph."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(1000, 16)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        x = self.embed(input_ids) * attention_mask.unsqueeze(-1)
        spread = torch.histc(x, bins=4, min=-1, max=1).sum()
        if x.sum() > 0:
            return x.mean(1) * spread
        return x.mean(1) - spread


def unexportable(**kwargs: int) -> nn.Module:
    torch.manual_seed(0)
    return _Unexportable()


class _ValueBranch(nn.Module):
    """A branch on a value: torch.export cannot trace it, the TorchScript-based exporter records the branch its
    example took (the ids are never all zero, so every input takes it)."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(1000, 16)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        x = self.embed(input_ids) * attention_mask.unsqueeze(-1)
        if input_ids.sum() > 0:
            return x.mean(1)
        return x.sum(1)


def value_branch(**kwargs: int) -> nn.Module:
    torch.manual_seed(0)
    return _ValueBranch()


class _BatchOfFour(_Wrapping):
    """A model that runs on batches of 4 only, as one whose recipe fixes the batch (min = max) may."""

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        if input_ids.shape[0] != 4:
            raise ValueError(f"this model takes batches of 4, not {input_ids.shape[0]}")
        return self.inner(input_ids, attention_mask)[1]


def batch_of_four(**kwargs: int) -> nn.Module:
    torch.manual_seed(0)
    return _BatchOfFour()


class _LargeBatchBranch(_Wrapping):
    """A branch on the batch size: a trace records the branch its example took (a small batch), so the traced
    graphs answer as a small batch does at every size, while the model takes the other branch past 4."""

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        pooled = self.inner(input_ids, attention_mask)[1]
        if input_ids.shape[0] > 4:
            return pooled * 2
        return pooled


def large_batch_branch(**kwargs: int) -> nn.Module:
    torch.manual_seed(0)
    return _LargeBatchBranch()
