"""Small real models for tests: a 2-layer transformer encoder (BERT-shaped I/O) and a small CNN."""

from __future__ import annotations

import torch
from torch import nn


class TinyEncoder(nn.Module):
    """Token embedding + 2 transformer layers; outputs per-token states and a masked mean-pooled embedding."""

    def __init__(self, vocab: int = 1000, hidden: int = 64, heads: int = 4, layers: int = 2, ffn: int = 128):
        super().__init__()
        self.embed = nn.Embedding(vocab, hidden)
        self.position = nn.Embedding(512, hidden)
        self.layers = nn.ModuleList(
            [
                nn.ModuleDict(
                    {
                        "query": nn.Linear(hidden, hidden),
                        "key": nn.Linear(hidden, hidden),
                        "value": nn.Linear(hidden, hidden),
                        "attention_out": nn.Linear(hidden, hidden),
                        "norm1": nn.LayerNorm(hidden),
                        "intermediate": nn.Linear(hidden, ffn),
                        "output": nn.Linear(ffn, hidden),
                        "norm2": nn.LayerNorm(hidden),
                    }
                )
                for _ in range(layers)
            ]
        )
        self.heads = heads

    def forward(
        self, input_ids: torch.Tensor, attention_mask: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        batch, seq = input_ids.shape
        positions = torch.arange(seq, device=input_ids.device).unsqueeze(0)
        x = self.embed(input_ids) + self.position(positions)
        bias = (1.0 - attention_mask[:, None, None, :].to(x.dtype)) * -10000.0
        for layer in self.layers:
            q, k, v = (self._split(layer[n](x)) for n in ("query", "key", "value"))
            scores = q @ k.transpose(-1, -2) / (q.shape[-1] ** 0.5) + bias
            ctx = (scores.softmax(-1) @ v).transpose(1, 2).reshape(batch, seq, -1)
            x = layer["norm1"](x + layer["attention_out"](ctx))
            x = layer["norm2"](x + layer["output"](nn.functional.gelu(layer["intermediate"](x))))
        mask = attention_mask.unsqueeze(-1).to(x.dtype)
        pooled = (x * mask).sum(1) / mask.sum(1).clamp(min=1e-9)
        return x, nn.functional.normalize(pooled, dim=1)

    def _split(self, t: torch.Tensor) -> torch.Tensor:
        b, s, h = t.shape
        return t.view(b, s, self.heads, h // self.heads).transpose(1, 2)


class TinyCNN(nn.Module):
    def __init__(self, classes: int = 10):
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(3, 8, 3, padding=1),
            nn.BatchNorm2d(8),
            nn.ReLU(),
            nn.MaxPool2d(2),
            nn.Conv2d(8, 16, 3, padding=1),
            nn.ReLU(),
            nn.AdaptiveAvgPool2d(1),
        )
        self.head = nn.Linear(16, classes)

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        return self.head(self.features(images).flatten(1))


def encoder(**kwargs: int) -> nn.Module:
    return TinyEncoder(**kwargs)


def cnn(**kwargs: int) -> nn.Module:
    return TinyCNN(**kwargs)


class ScoreLabel(nn.Module):
    """The output kinds the accuracy gates tell apart: an embedding (values), a sigmoid score and a count
    that follows the input's shape (one value per sample), and an argmax class (integer values)."""

    def __init__(self, features: int = 16, width: int = 8, classes: int = 5):
        super().__init__()
        self.body = nn.Sequential(nn.Linear(features, 32), nn.GELU(), nn.Linear(32, width))
        self.rank = nn.Linear(width, 1)
        self.head = nn.Linear(width, classes)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        embedding = self.body(x)
        score = torch.sigmoid(self.rank(embedding))
        count = torch.ones_like(score) * x.shape[1]
        return embedding, score, count, self.head(embedding).argmax(-1)


def score_label(**kwargs: int) -> nn.Module:
    return ScoreLabel(**kwargs)


class TinyLabeller(nn.Module):
    """One value per sample in and out: features [batch, 8] and a per-sample offset [batch] give an embedding
    [batch, 4] and an int64 class label [batch] (the argmax of a small head)."""

    def __init__(self, features: int = 8, width: int = 4, classes: int = 5):
        super().__init__()
        self.body = nn.Linear(features, width)
        self.head = nn.Linear(width, classes)

    def forward(self, x: torch.Tensor, offset: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        embedding = torch.tanh(self.body(x)) + offset.unsqueeze(1)
        return embedding, self.head(embedding).argmax(-1)


def labeller(**kwargs: int) -> nn.Module:
    return TinyLabeller(**kwargs)


class TinyScatter(nn.Module):
    """Counts per bucket with scatter_add (ScatterElements, reduction 'add') and a running sum, beside a linear
    layer: an FP16 copy must keep the accumulating scatter in float32, which ONNX Runtime's CPU provider has no
    float16 kernel for."""

    def __init__(self, features: int = 8, buckets: int = 6):
        super().__init__()
        self.body = nn.Linear(features, features)
        self.buckets = buckets

    def forward(self, x: torch.Tensor, bucket: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        hidden = self.body(x)
        weights = hidden.sigmoid()
        counts = torch.zeros(x.shape[0], self.buckets, dtype=x.dtype).scatter_add(1, bucket, weights)
        return hidden, counts


def scatter(**kwargs: int) -> nn.Module:
    return TinyScatter(**kwargs)


class WindowPadded(nn.Module):
    """A convolution over windows of 8 pixels, padding an image whose sides are not a multiple of 8 first (as
    Swin pads to its window): a Python branch on the input's size, which tracing exporters freeze."""

    def __init__(self, channels: int = 3, width: int = 8):
        super().__init__()
        self.conv = nn.Conv2d(channels, width, kernel_size=8, stride=8)

    def forward(self, pixel_values: torch.Tensor) -> torch.Tensor:
        height, width = pixel_values.shape[-2:]
        if height % 8 or width % 8:
            pixel_values = nn.functional.pad(pixel_values, (0, -width % 8, 0, -height % 8))
        return self.conv(pixel_values).flatten(2).amax(dim=2)


def window_padded(**kwargs: int) -> nn.Module:
    return WindowPadded(**kwargs)


class KeyPaddingEncoder(nn.Module):
    """nn.TransformerEncoder with a key-padding mask (True marks padding), in eval mode: PyTorch's fast path runs
    it on nested tensors and writes 0 at padded positions, which an exported graph computes as real values."""

    def __init__(self, vocab: int = 500, hidden: int = 32, layers: int = 2):
        super().__init__()
        self.embed = nn.Embedding(vocab, hidden)
        layer = nn.TransformerEncoderLayer(hidden, 4, 64, dropout=0.0, batch_first=True)
        self.encoder = nn.TransformerEncoder(layer, layers)

    def forward(self, tokens: torch.Tensor, src_key_padding_mask: torch.Tensor) -> torch.Tensor:
        return self.encoder(self.embed(tokens), src_key_padding_mask=src_key_padding_mask)


def key_padding_encoder(**kwargs: int) -> nn.Module:
    return KeyPaddingEncoder(**kwargs)


class PaddingZeroedInPython(nn.Module):
    """Per-token states zeroed at padded positions only when the batch has padding, decided in Python as
    nn.TransformerEncoder decides to take its nested-tensor fast path: a trace keeps the branch its example
    took, so a trace made on a batch without padding computes padded positions that eager writes as 0."""

    def __init__(self, vocab: int = 500, hidden: int = 16):
        super().__init__()
        self.embed = nn.Embedding(vocab, hidden)
        self.mix = nn.Linear(hidden, hidden)

    def forward(self, tokens: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        states = torch.tanh(self.mix(self.embed(tokens)))
        if not bool(attention_mask.all()):
            states = states * attention_mask.unsqueeze(-1).to(states.dtype)
        return states


def padding_zeroed_in_python(**kwargs: int) -> nn.Module:
    return PaddingZeroedInPython(**kwargs)


class LongerScaled(nn.Module):
    """Per-token states scaled when the sequence is longer than 8, a Python decision on a shape: a trace made at
    8 tokens computes longer batches another way, on real tokens as on padded ones."""

    def __init__(self, vocab: int = 500, hidden: int = 16):
        super().__init__()
        self.embed = nn.Embedding(vocab, hidden)

    def forward(self, tokens: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        states = self.embed(tokens) * attention_mask.unsqueeze(-1).to(torch.float32)
        return states * 2 if tokens.shape[1] > 8 else states


def longer_scaled(**kwargs: int) -> nn.Module:
    return LongerScaled(**kwargs)


class PairLogits(nn.Module):
    """A CLIP-style similarity: every sample's embedding (the mean over its sequence) against every other's,
    logits [batch, batch], beside a score [batch, 1]. At a batch of 1 both are one value."""

    def __init__(self, features: int = 8, width: int = 4):
        super().__init__()
        self.body = nn.Linear(features, width)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        embedding = torch.nn.functional.normalize(self.body(x).mean(1), dim=-1)
        return embedding @ embedding.T, embedding.sum(-1, keepdim=True)


def pair_logits(**kwargs: int) -> nn.Module:
    return PairLogits(**kwargs)


class BatchStandardized(nn.Module):
    """Features standardized over the batch: NaN at a batch of 1 (the spread of one sample), finite from 2."""

    def __init__(self, features: int = 8):
        super().__init__()
        self.body = nn.Linear(features, features)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        h = self.body(x.mean(1))
        return (h - h.mean(0)) / h.std(0), h


def batch_standardized(**kwargs: int) -> nn.Module:
    return BatchStandardized(**kwargs)


class SqueezedAtTwo(nn.Module):
    """A score [batch, 1] at a batch of 1 that a stray squeeze() turns into [batch] from a batch of 2 on."""

    def __init__(self, features: int = 8):
        super().__init__()
        self.body = nn.Linear(features, 1)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        score = self.body(x.mean(1))
        return score if x.shape[0] == 1 else score.squeeze(), x.mean(1)


def squeezed_at_two(**kwargs: int) -> nn.Module:
    return SqueezedAtTwo(**kwargs)


class BoxLayout(nn.Module):
    """Tokens with a box each (x1, y1, x2, y2), embedded by width and height as LayoutLM does: a box whose
    corners are out of order is an index below zero, which inputs drawn in a value range make half the time."""

    def __init__(self, vocab: int = 100, coords: int = 64, hidden: int = 16) -> None:
        super().__init__()
        self.tokens = nn.Embedding(vocab, hidden)
        self.width = nn.Embedding(coords, hidden)
        self.height = nn.Embedding(coords, hidden)

    def forward(self, input_ids: torch.Tensor, boxes: torch.Tensor) -> torch.Tensor:
        width, height = boxes[..., 2] - boxes[..., 0], boxes[..., 3] - boxes[..., 1]
        return self.tokens(input_ids) + self.width(width) + self.height(height)


def box_layout(**kwargs: int) -> nn.Module:
    return BoxLayout(**kwargs)


class TopItems(nn.Module):
    """Scores a set of items [batch, items, features] and returns the top 3 items' indices and scores: an
    integer output that two runtimes agree on only where no two scores tie."""

    def __init__(self, features: int = 6, hidden: int = 16):
        super().__init__()
        self.score = nn.Sequential(nn.Linear(features, hidden), nn.Tanh(), nn.Linear(hidden, 1))

    def forward(self, items: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        top = torch.topk(self.score(items).squeeze(-1), k=3, dim=1)
        return top.indices, top.values


def top_items(**kwargs: int) -> nn.Module:
    return TopItems(**kwargs)


class _SquashFunction(torch.autograd.Function):
    """A GELU written as an autograd Function with a backward of its own, as BLOOM writes its activation."""

    @staticmethod
    def forward(ctx: torch.autograd.function.FunctionCtx, x: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(x)
        return x * 0.5 * (1.0 + torch.tanh(0.79788456 * x * (1 + 0.044715 * x * x)))

    @staticmethod
    def backward(ctx: torch.autograd.function.FunctionCtx, grad: torch.Tensor) -> torch.Tensor:
        return grad


class FunctionActivation(nn.Module):
    """Token embeddings through a feed-forward block whose activation is a custom autograd Function;
    per-token states and their masked mean, as the tiny recipe names them (hidden, pooled)."""

    def __init__(self, vocab: int = 1000, hidden: int = 32):
        super().__init__()
        self.embed = nn.Embedding(vocab, hidden)
        self.up, self.down = nn.Linear(hidden, 2 * hidden), nn.Linear(2 * hidden, hidden)

    def forward(
        self, input_ids: torch.Tensor, attention_mask: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        x = self.embed(input_ids)
        x = x + self.down(_SquashFunction.apply(self.up(x)))
        mask = attention_mask.unsqueeze(-1).to(x.dtype)
        return x, (x * mask).sum(1) / mask.sum(1).clamp(min=1e-9)


def function_activation(**kwargs: int) -> nn.Module:
    return FunctionActivation()


class KeywordsOnly(nn.Module):
    """Takes its inputs as `**inputs` and reads them by name, as some serving wrappers do."""

    def __init__(self, vocab: int = 1000, hidden: int = 32):
        super().__init__()
        self.embed = nn.Embedding(vocab, hidden)

    def forward(self, **inputs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        x = self.embed(inputs["input_ids"])
        mask = inputs["attention_mask"].unsqueeze(-1).to(x.dtype)
        return x, (x * mask).sum(1) / mask.sum(1).clamp(min=1e-9)


def keywords_only(**kwargs: int) -> nn.Module:
    return KeywordsOnly()


class LastPositionByNumber(nn.Module):
    """Reads the last position by a number computed in Python from the input's length (Funnel's relative
    positions are indexed so): a trace keeps the opt shape's number, which is out of range at a shorter one."""

    def __init__(self, vocab: int = 1000, hidden: int = 32):
        super().__init__()
        self.embed = nn.Embedding(vocab, hidden)

    def forward(
        self, input_ids: torch.Tensor, attention_mask: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        x = self.embed(input_ids)
        last = int(x.shape[1]) - 1
        return x, x[:, last]


def last_position_by_number(**kwargs: int) -> nn.Module:
    return LastPositionByNumber()
