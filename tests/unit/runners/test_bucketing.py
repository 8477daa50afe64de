"""Padding-aware execution: the group plan, and the tiny encoder run group by group on the CPU matches the
whole padded batch on every real token and on the pooled embedding."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from pipeline.recipe import PaddingConfig
from pipeline.runners.bucketing import Bucketing, plan_groups, plan_key

# MiniLM's validation split (token lengths), cycled to a batch of 256 as the benchmark does
MINILM = np.array(
    [6, 7, 8, 11, 12, 16, 17, 17, 18, 18, 19, 19, 19, 20, 20, 21, 21, 21, 21, 21]
    + [29, 39, 40, 41, 42, 42, 42, 44, 45, 46, 128, 128]
)


def _check_cover(groups: list, lengths: np.ndarray, full: int) -> None:
    rows = np.concatenate([g.index for g in groups])
    assert sorted(rows.tolist()) == list(range(len(lengths)))  # every row exactly once
    for g in groups:
        assert (lengths[g.index] <= g.length).all() and g.length <= full


@pytest.mark.parametrize("max_groups", [1, 2, 3, 4])
def test_plan_covers_the_batch_and_saves_tokens(max_groups: int) -> None:
    lengths = np.tile(MINILM, 8)
    groups = plan_groups(lengths, 128, 16, max_groups, overhead=512, min_length=8)
    _check_cover(groups, lengths, 128)
    assert len(groups) <= max_groups
    computed = sum(len(g.index) * g.length for g in groups)
    if max_groups == 1:
        assert [(len(g.index), g.length) for g in groups] == [(256, 128)]
    else:  # the two 128-token sentences get a group of their own; the short ones run at most 48 long
        assert computed <= 13568 and any(g.length == 128 and len(g.index) == 16 for g in groups)


def test_plan_edge_cases() -> None:
    assert [(len(g.index), g.length) for g in plan_groups(np.array([17]), 128, 16, 4, 512, 8)] == [(1, 32)]
    # splitting off one short row would save less than a call costs
    assert [(len(g.index), g.length) for g in plan_groups(np.array([3, 128]), 128, 16, 4, 512)] == [(2, 128)]
    # never below the sequence dim's minimum, never above the padded length
    assert plan_groups(np.array([0, 1]), 12, 16, 2, 0, min_length=4)[0].length == 12
    assert plan_groups(np.array([2, 2]), 128, 1, 2, 0, min_length=4)[0].length == 4


def test_bucketed_run_matches_the_padded_batch_on_real_tokens(ctx) -> None:
    module = ctx.model().module
    feeds = ctx.dataset().feeds_at({"batch": 6, "sequence": 32})
    real = np.array([3, 32, 5, 9, 17, 4])
    mask = (np.arange(32)[None, :] < real[:, None]).astype(feeds["attention_mask"].dtype)
    tensors = [torch.from_numpy(feeds["input_ids"]), torch.from_numpy(mask)]
    cfg = PaddingConfig(
        mask_input="attention_mask", per_token_outputs=["hidden"], multiple=4, group_overhead_tokens=0
    )
    bucketing = Bucketing(cfg, ctx.settings)
    calls: list[tuple[int, ...]] = []

    def call(sub: list[torch.Tensor]) -> tuple[torch.Tensor, ...]:
        calls.append(tuple(sub[0].shape))
        return module(*sub)

    with torch.no_grad():
        hidden, pooled = bucketing.run(tensors, call)
        want_hidden, want_pooled = module(*tensors)
    assert len(calls) > 1 and all(shape[1] < 32 for shape in calls[:-1])
    assert bucketing.last_plan["computed_tokens"] < bucketing.last_plan["padded_tokens"] == 6 * 32
    real_mask = torch.from_numpy(mask).bool()
    assert torch.allclose(hidden[real_mask], want_hidden[real_mask], atol=1e-5)
    # padded positions beyond each group's length are zero (not left over from another call)
    for row, group_len in _group_length_of_rows(bucketing).items():
        assert (hidden[row, group_len:] == 0).all()
    assert torch.allclose(pooled, want_pooled, atol=1e-6)


def test_left_padded_rows_run_whole_and_keep_their_positions(ctx) -> None:
    """Padding in front of a row (left padding): trimming to the row's length kept the padding and cut the real
    tokens (cosine 0 on the required graph, hold-out of the packed variants). A row now keeps everything up to
    its last real token; right-padded rows in the same batch are still trimmed."""
    module = ctx.model().module
    feeds = ctx.dataset().feeds_at({"batch": 4, "sequence": 32})
    columns = np.arange(32)[None, :]
    mask = np.stack(
        [columns[0] >= 29, columns[0] < 5, columns[0] >= 20, columns[0] < 9]  # left, right, left, right
    ).astype(feeds["attention_mask"].dtype)
    tensors = [torch.from_numpy(feeds["input_ids"]), torch.from_numpy(mask)]
    cfg = PaddingConfig(mask_input="attention_mask", per_token_outputs=["hidden"], group_overhead_tokens=0)
    bucketing = Bucketing(cfg, ctx.settings, "cpu")
    with torch.no_grad():
        hidden, pooled = bucketing.run(tensors, lambda sub: module(*sub))
        want_hidden, want_pooled = module(*tensors)
    real = torch.from_numpy(mask).bool()
    assert torch.allclose(hidden[real], want_hidden[real], atol=1e-5)
    assert torch.allclose(pooled, want_pooled, atol=1e-6)
    assert bucketing.last_plan["real_tokens"] == int(mask.sum())
    assert bucketing.last_plan["computed_tokens"] < 4 * 32  # the right-padded rows were still trimmed


def _group_length_of_rows(bucketing: Bucketing) -> dict[int, int]:
    return {int(r): g.length for g in bucketing.last_groups for r in g.index}


def test_unpadded_batch_is_one_plain_call(ctx) -> None:
    feeds = ctx.dataset().feeds_at({"batch": 2, "sequence": 16})
    tensors = [torch.from_numpy(feeds[s.name]) for s in ctx.recipe.inputs]
    bucketing = Bucketing(PaddingConfig(per_token_outputs=["hidden"]), ctx.settings)
    calls = []
    bucketing.run(tensors, lambda sub: calls.append(sub) or ctx.model().module(*sub))
    assert len(calls) == 1 and calls[0][0] is tensors[0]


def test_one_group_is_trimmed_by_slicing(ctx) -> None:
    module = ctx.model().module
    feeds = ctx.dataset().feeds_at({"batch": 2, "sequence": 32})
    mask = (np.arange(32)[None, :] < np.array([[5], [7]])).astype(feeds["attention_mask"].dtype)
    tensors = [torch.from_numpy(feeds["input_ids"]), torch.from_numpy(mask)]
    cfg = PaddingConfig(per_token_outputs=["hidden"], multiple=4)
    shapes: list[tuple[int, ...]] = []

    def call(sub: list[torch.Tensor]) -> tuple[torch.Tensor, ...]:
        shapes.append(tuple(sub[0].shape))
        return module(*sub)

    with torch.no_grad():
        hidden, pooled = Bucketing(cfg, ctx.settings).run(tensors, call)
        want_hidden, want_pooled = module(*tensors)
    assert shapes == [(2, 8)] and hidden.shape == want_hidden.shape
    real = torch.from_numpy(mask).bool()
    assert torch.allclose(hidden[real], want_hidden[real], atol=1e-5) and (hidden[:, 8:] == 0).all()
    assert torch.allclose(pooled, want_pooled, atol=1e-6)


def test_rows_of_equal_length_in_every_group_land_back_in_place(ctx) -> None:
    """Many rows, repeated lengths and four groups: each row's outputs come back at its own index."""
    module = ctx.model().module
    feeds = ctx.dataset().feeds_at({"batch": 24, "sequence": 32})
    real = np.tile([3, 32, 5, 9, 17, 4, 9, 30], 3)
    mask = (np.arange(32)[None, :] < real[:, None]).astype(feeds["attention_mask"].dtype)
    ids = np.random.default_rng(0).integers(1, 50, size=(24, 32)).astype(feeds["input_ids"].dtype)
    tensors = [torch.from_numpy(ids), torch.from_numpy(mask)]
    cfg = PaddingConfig(per_token_outputs=["hidden"], multiple=4, max_groups=4, group_overhead_tokens=0)
    bucketing = Bucketing(cfg, ctx.settings)
    with torch.no_grad():
        hidden, pooled = bucketing.run(tensors, lambda sub: module(*sub))
        want_hidden, want_pooled = module(*tensors)
    assert len(bucketing.last_groups) == 4
    real_mask = torch.from_numpy(mask).bool()
    assert torch.allclose(hidden[real_mask], want_hidden[real_mask], atol=1e-5)
    assert torch.allclose(pooled, want_pooled, atol=1e-6)


def test_a_plan_serves_every_batch_with_the_same_group_sizes(ctx) -> None:
    """What a captured padding-aware call relies on: execute() uses only the plan's group sizes and lengths
    (plan_key), so a plan made for one batch gives exact results for another whose rows come in another order."""
    module = ctx.model().module
    feeds = ctx.dataset().feeds_at({"batch": 8, "sequence": 32})
    rng = np.random.default_rng(1)
    real = np.array([3, 32, 5, 9, 17, 4, 9, 30])
    cfg = PaddingConfig(per_token_outputs=["hidden"], multiple=4, max_groups=3, group_overhead_tokens=0)
    bucketing = Bucketing(cfg, ctx.settings)

    def batch(lengths: np.ndarray) -> list[torch.Tensor]:
        mask = (np.arange(32)[None, :] < lengths[:, None]).astype(feeds["attention_mask"].dtype)
        ids = rng.integers(1, 50, size=(8, 32)).astype(feeds["input_ids"].dtype)
        return [torch.from_numpy(ids), torch.from_numpy(mask)]

    first = batch(real)
    groups = bucketing.plan(first)
    other = batch(real[::-1].copy())
    assert plan_key(bucketing.plan(other)) == plan_key(groups) and len(groups) == 3
    with torch.no_grad():
        hidden, pooled = bucketing.execute(other, groups, lambda sub: module(*sub))
        want_hidden, want_pooled = module(*other)
    real_mask = other[1].bool()
    assert torch.allclose(hidden[real_mask], want_hidden[real_mask], atol=1e-5)
    assert torch.allclose(pooled, want_pooled, atol=1e-6)


def test_groups_of_an_odd_length_batch_reach_the_callee_dense_and_aligned(ctx) -> None:
    """Rows 1.. of a batch 221 tokens long start at an odd multiple of 8 bytes: as views, AOTInductor would copy
    them on every call ("compiled as 16-bytes aligned, but it is not aligned at run time")."""
    module = ctx.model().module
    feeds = ctx.dataset().feeds_at({"batch": 8, "sequence": 32})
    full = 221
    real = np.array([3, 221, 5, 9, 17, 4, 9, 30])
    mask = (np.arange(full)[None, :] < real[:, None]).astype(feeds["attention_mask"].dtype)
    ids = np.random.default_rng(2).integers(1, 50, size=(8, full)).astype(feeds["input_ids"].dtype)
    tensors = [torch.from_numpy(ids), torch.from_numpy(mask)]
    cfg = PaddingConfig(per_token_outputs=["hidden"], multiple=4, max_groups=3, group_overhead_tokens=0)
    seen: list[torch.Tensor] = []

    def call(sub: list[torch.Tensor]):
        seen.extend(sub)
        return module(*sub)

    with torch.no_grad():
        hidden, pooled = Bucketing(cfg, ctx.settings).run(tensors, call)
        want_hidden, want_pooled = module(*tensors)
    assert len(seen) == 6  # three groups, two inputs each
    assert all(t.is_contiguous() and t.data_ptr() % 16 == 0 for t in seen), [t.data_ptr() % 16 for t in seen]
    real_mask = tensors[1].bool()
    assert torch.allclose(hidden[real_mask], want_hidden[real_mask], atol=1e-5)
    assert torch.allclose(pooled, want_pooled, atol=1e-6)


def test_without_a_multiple_the_cpu_runs_a_sentence_at_its_real_length_and_the_gpu_rounds_to_16(ctx) -> None:
    cfg = PaddingConfig(per_token_outputs=["hidden"])
    feeds = ctx.dataset().feeds_at({"batch": 1, "sequence": 32})
    mask = (np.arange(32)[None, :] < 5).astype(feeds["attention_mask"].dtype)
    tensors = [torch.from_numpy(feeds["input_ids"]), torch.from_numpy(mask)]
    cpu, gpu = Bucketing(cfg, ctx.settings, "cpu"), Bucketing(cfg, ctx.settings, "cuda")
    assert [g.length for g in cpu.plan(tensors)] == [5] and [g.length for g in gpu.plan(tensors)] == [16]
    assert Bucketing(cfg.model_copy(update={"multiple": 8}), ctx.settings, "cpu").plan(tensors)[0].length == 8
