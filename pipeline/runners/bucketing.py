"""Padding-aware execution: split a padded batch by real length, run each group trimmed, scatter back.

Real text traffic is short sentences padded to a fixed length, so most positions of a batch are padding.
Attention masks padded keys out exactly, so a sequence trimmed to any length >= its real length gives the same
values on its real tokens and the same mask-pooled embedding.
`plan_groups` sorts the batch by real length and cuts it into at most `max_groups` groups (a dynamic
programme over the distinct rounded lengths, minimizing computed tokens plus a fixed cost per group); the
runner then calls the model once per group at (group size, group length) and writes the results into
full-size outputs. Per-token outputs at padded positions are what the model computes for padding at the
group's length, and zero beyond it: no consumer may read them (validation compares real tokens only).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from pipeline.core.length_groups import Group, plan_groups

if TYPE_CHECKING:
    import torch

    from pipeline.inputs.specs import RunnerSettings
    from pipeline.recipe import PaddingConfig


class Bucketing:
    """Runs a model callable group by group on torch tensors (CPU or CUDA); see the module docstring."""

    def __init__(self, cfg: PaddingConfig, settings: RunnerSettings, device: str = "cuda"):
        seq_dim = settings.sequence_dim
        self.cfg = cfg
        # GPU: few distinct lengths, since each plan is a CUDA graph of its own; CPU: nothing is captured, so
        # every token cut pays (MiniLM at batch 1: 5.7x the padded row at multiple 1, 3.4x at 16, one run each)
        self.multiple = cfg.multiple or (16 if device == "cuda" else 1)
        self.inputs = [s.name for s in settings.inputs]  # the order the tensors come in
        self.outputs = list(settings.outputs)  # the order `call` returns results in
        self.mask = self.inputs.index(cfg.mask_input)
        self.trimmed = [len(s.shape) > 1 and s.shape[1] == seq_dim for s in settings.inputs]
        self.per_token = [name in cfg.per_token_outputs for name in settings.outputs]
        self.min_length = settings.dims[seq_dim].min if seq_dim in settings.dims else 1
        self.last_plan: dict[str, Any] | None = None
        self.last_groups: list[Group] = []

    def run(
        self,
        tensors: Sequence[torch.Tensor],
        call: Callable[[list[torch.Tensor]], Sequence[torch.Tensor]],
        contiguous: bool = True,
    ) -> list[torch.Tensor]:
        """Plan and execute one padded batch; `call` runs the model on one group."""
        return self.execute(tensors, self.plan(tensors), call, contiguous)

    def plan(self, tensors: Sequence[torch.Tensor]) -> list[Group]:
        """The groups of this batch, from how far into each row its real tokens reach (the one host sync a
        padding-aware call costs). A row is trimmed after its last real token, never before: with padding at the
        end that is its length; with padding in front (left padding) it is the whole row, which then runs as it
        came, so that every real token keeps its position."""
        import torch

        mask = tensors[self.mask] != 0
        batch, full = mask.shape[:2]
        counted = torch.stack([mask.sum(dim=1), _reach(mask)]).cpu().numpy()
        real, reach = counted[0], counted[1]
        cfg = self.cfg
        groups = plan_groups(
            reach, full, self.multiple, cfg.max_groups, cfg.group_overhead_tokens, self.min_length
        )
        self.last_groups = groups
        self.last_plan = {
            "groups": [[len(g.index), g.length] for g in groups],
            "computed_tokens": sum(len(g.index) * g.length for g in groups),
            "padded_tokens": int(batch * full),
            "real_tokens": int(real.sum()),
        }
        return groups

    def execute(
        self,
        tensors: Sequence[torch.Tensor],
        groups: list[Group],
        call: Callable[[list[torch.Tensor]], Sequence[torch.Tensor]],
        contiguous: bool = True,
    ) -> list[torch.Tensor]:
        """Run the groups of `plan` and scatter their results back. Only the groups' sizes and lengths are
        used, and every other step runs on the device without a host sync, so one CUDA graph can capture
        the whole call for every batch with the same plan; `contiguous=False` when `call` copies strided
        inputs itself."""
        import torch

        batch, full = tensors[self.mask].shape[:2]
        if len(groups) == 1 and groups[0].length == full:
            return list(call(list(tensors)))
        if len(groups) == 1:  # every row, in order: trim by slicing
            return self._trimmed(tensors, call, groups[0].length, full, contiguous)
        # Rows sorted by reach on the device: rounding keeps that order, so every group is a run of it.
        # One gather per input serves all groups, and no row index crosses from the host.
        order = torch.argsort(_reach(tensors[self.mask] != 0), stable=True)
        ranked = [t.index_select(0, order) for t in tensors]
        outputs: list[torch.Tensor] | None = None
        start = 0
        for group in groups:
            end = start + len(group.index)
            sub = [
                _contiguous(t[start:end, : group.length] if trim else t[start:end], contiguous)
                for t, trim in zip(ranked, self.trimmed, strict=True)
            ]
            results = list(call(sub))
            if outputs is None:
                outputs = [
                    self._full(r, batch, full, per) for r, per in zip(results, self.per_token, strict=True)
                ]
            rows = order[start:end]
            for out, r, per in zip(outputs, results, self.per_token, strict=True):
                (out[:, : group.length] if per else out).index_copy_(0, rows, r)
            start = end
        assert outputs is not None
        return outputs

    def _trimmed(
        self,
        tensors: Sequence[torch.Tensor],
        call: Callable[[list[torch.Tensor]], Sequence[torch.Tensor]],
        length: int,
        full: int,
        contiguous: bool,
    ) -> list[torch.Tensor]:
        sub = [
            _contiguous(t[:, :length], contiguous) if trim else t
            for t, trim in zip(tensors, self.trimmed, strict=True)
        ]
        outputs = []
        for r, per in zip(call(sub), self.per_token, strict=True):
            if per:
                out = self._full(r, r.shape[0], full, True)
                out[:, :length] = r
                r = out
            outputs.append(r)
        return outputs

    @staticmethod
    def _full(result: torch.Tensor, batch: int, full: int, per_token: bool) -> torch.Tensor:
        import torch

        if per_token:
            return torch.zeros((batch, full, *result.shape[2:]), dtype=result.dtype, device=result.device)
        return torch.empty((batch, *result.shape[1:]), dtype=result.dtype, device=result.device)


def _reach(real: torch.Tensor) -> torch.Tensor:
    """Per row, one past its last real token (0 for a row of padding): how far a trimmed row must keep."""
    import torch

    columns = torch.arange(1, real.shape[1] + 1, device=real.device)
    return (real * columns).amax(dim=1)


ALIGNMENT = 16  # bytes: AOTInductor compiles for inputs aligned so, and copies any that are not on every call


def _contiguous(tensor: torch.Tensor, wanted: bool) -> torch.Tensor:
    """A dense, aligned tensor for a callee that needs one: a group's rows start wherever the group does, so
    a view of them is misaligned when the rows before it hold an odd number of 8-byte elements (odd lengths)."""
    if not wanted:
        return tensor
    if not tensor.is_contiguous():
        return tensor.contiguous()  # a fresh allocation: aligned
    return tensor if tensor.data_ptr() % ALIGNMENT == 0 else tensor.clone()


def plan_key(groups: list[Group]) -> tuple[tuple[int, int], ...]:
    """What a captured padding-aware call depends on: each group's size and length."""
    return tuple((len(g.index), g.length) for g in groups)
