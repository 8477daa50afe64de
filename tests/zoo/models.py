"""The model zoo: small models of the kinds users bring, built from code with random weights.

Each factory is what a user's own `model.py` would hold: a torchvision-style CNN written by hand (torchvision
cannot run beside the CPU torch here), a Hugging Face model built from its config, or a plain module with
unusual inputs or outputs. Sizes are tiny so that each deploys in well under a minute on a 2-core CPU; the
architectures are the real ones (residual bottlenecks, depthwise convolutions, causal attention, relative
position buckets, cross-attention), since those are what break exports and quantizers.
"""

from __future__ import annotations

import torch
from torch import nn

# ---------------------------------------------------------------- CNNs, torchvision-style


class Bottleneck(nn.Module):
    """torchvision's ResNet bottleneck: 1x1 reduce, 3x3, 1x1 expand, BatchNorm after each, residual add."""

    def __init__(self, inplanes: int, planes: int, stride: int = 1):
        super().__init__()
        width, out = planes, planes * 4
        self.conv1 = nn.Conv2d(inplanes, width, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(width)
        self.conv2 = nn.Conv2d(width, width, 3, stride=stride, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(width)
        self.conv3 = nn.Conv2d(width, out, 1, bias=False)
        self.bn3 = nn.BatchNorm2d(out)
        self.relu = nn.ReLU(inplace=True)
        self.downsample = None
        if stride != 1 or inplanes != out:
            self.downsample = nn.Sequential(
                nn.Conv2d(inplanes, out, 1, stride=stride, bias=False), nn.BatchNorm2d(out)
            )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        identity = x if self.downsample is None else self.downsample(x)
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.relu(self.bn2(self.conv2(out)))
        return self.relu(self.bn3(self.conv3(out)) + identity)


class ResNet(nn.Module):
    """torchvision's ResNet layout (stem, four stages, global pool, fc) at a small width."""

    def __init__(self, layers: tuple[int, ...] = (1, 1, 1, 1), width: int = 8, classes: int = 10):
        super().__init__()
        self.conv1 = nn.Conv2d(3, width, 7, stride=2, padding=3, bias=False)
        self.bn1 = nn.BatchNorm2d(width)
        self.relu = nn.ReLU(inplace=True)
        self.maxpool = nn.MaxPool2d(3, stride=2, padding=1)
        stages, inplanes = [], width
        for i, blocks in enumerate(layers):
            planes = width * 2**i
            for b in range(blocks):
                stages.append(Bottleneck(inplanes, planes, stride=2 if b == 0 and i > 0 else 1))
                inplanes = planes * 4
        self.layers = nn.Sequential(*stages)
        self.avgpool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(inplanes, classes)
        _init_batchnorm(self)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.maxpool(self.relu(self.bn1(self.conv1(x))))
        return self.fc(torch.flatten(self.avgpool(self.layers(x)), 1))


class InvertedResidual(nn.Module):
    """MobileNetV2's block: 1x1 expand, 3x3 depthwise, 1x1 linear projection, residual when shapes allow."""

    def __init__(self, inp: int, out: int, stride: int, expand: int):
        super().__init__()
        hidden = inp * expand
        self.residual = stride == 1 and inp == out
        self.block = nn.Sequential(
            nn.Conv2d(inp, hidden, 1, bias=False),
            nn.BatchNorm2d(hidden),
            nn.ReLU6(inplace=True),
            nn.Conv2d(hidden, hidden, 3, stride=stride, padding=1, groups=hidden, bias=False),
            nn.BatchNorm2d(hidden),
            nn.ReLU6(inplace=True),
            nn.Conv2d(hidden, out, 1, bias=False),
            nn.BatchNorm2d(out),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.block(x) if self.residual else self.block(x)


class MobileNet(nn.Module):
    def __init__(self, width: int = 8, classes: int = 10):
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(3, width, 3, stride=2, padding=1, bias=False),
            nn.BatchNorm2d(width),
            nn.ReLU6(inplace=True),
            InvertedResidual(width, width, 1, 1),
            InvertedResidual(width, 2 * width, 2, 4),
            InvertedResidual(2 * width, 2 * width, 1, 4),
            InvertedResidual(2 * width, 4 * width, 2, 4),
        )
        self.classifier = nn.Sequential(nn.Dropout(0.2), nn.Linear(4 * width, classes))
        _init_batchnorm(self)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = nn.functional.adaptive_avg_pool2d(self.features(x), 1)
        return self.classifier(torch.flatten(x, 1))


def _init_batchnorm(model: nn.Module) -> None:
    """Running statistics as a trained network has them (not 0 and 1), so that BatchNorm folding matters."""
    generator = torch.Generator().manual_seed(1)
    for m in model.modules():
        if isinstance(m, nn.BatchNorm2d):
            m.running_mean.copy_(torch.randn(m.num_features, generator=generator) * 0.1)
            m.running_var.copy_(torch.rand(m.num_features, generator=generator) + 0.5)


def resnet(**kwargs: int) -> nn.Module:
    return ResNet(**kwargs)


def mobilenet(**kwargs: int) -> nn.Module:
    return MobileNet(**kwargs)


# ---------------------------------------------------------------- Hugging Face models from configs

TEXT = {"vocab_size": 512, "hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 2}


def bert() -> nn.Module:
    from transformers import BertConfig, BertModel

    return BertModel(BertConfig(**TEXT, intermediate_size=64, max_position_embeddings=64))


def distilbert() -> nn.Module:
    from transformers import DistilBertConfig, DistilBertModel

    config = DistilBertConfig(vocab_size=512, dim=32, n_layers=2, n_heads=2, hidden_dim=64)
    return DistilBertModel(config)


def roberta() -> nn.Module:
    from transformers import RobertaConfig, RobertaModel

    return RobertaModel(RobertaConfig(**TEXT, intermediate_size=64, max_position_embeddings=70))


def vit() -> nn.Module:
    from transformers import ViTConfig, ViTModel

    config = ViTConfig(
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=64,
        image_size=32,
        patch_size=8,
    )
    return ViTModel(config)


def gpt2() -> nn.Module:
    from transformers import GPT2Config, GPT2LMHeadModel

    return GPT2LMHeadModel(
        GPT2Config(
            vocab_size=512, n_embd=32, n_layer=2, n_head=2, n_positions=64, bos_token_id=0, eos_token_id=0
        )
    )


def t5_encoder() -> nn.Module:
    from transformers import T5Config, T5EncoderModel

    config = T5Config(vocab_size=512, d_model=32, d_kv=16, d_ff=64, num_layers=2, num_heads=2)
    return T5EncoderModel(config)


def whisper() -> nn.Module:
    """Encoder and decoder in one module: audio features and decoder token ids in, decoder states out."""
    from transformers import WhisperConfig, WhisperModel

    config = WhisperConfig(
        vocab_size=512,
        num_mel_bins=16,
        d_model=32,
        encoder_layers=2,
        decoder_layers=2,
        encoder_attention_heads=2,
        decoder_attention_heads=2,
        encoder_ffn_dim=64,
        decoder_ffn_dim=64,
        max_source_positions=16,
        max_target_positions=32,
        pad_token_id=0,
        bos_token_id=1,
        eos_token_id=2,
        decoder_start_token_id=1,
    )
    return WhisperModel(config)


# ---------------------------------------------------------------- unusual signatures


class TokensAndFeatures(nn.Module):
    """Two inputs of different dtypes: token ids (int64) and dense features (float32)."""

    def __init__(self, vocab: int = 256, hidden: int = 32, features: int = 8, classes: int = 4):
        super().__init__()
        self.embed = nn.Embedding(vocab, hidden)
        self.dense = nn.Linear(features, hidden)
        self.head = nn.Sequential(nn.Linear(2 * hidden, hidden), nn.GELU(), nn.Linear(hidden, classes))

    def forward(self, features: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
        pooled = self.embed(tokens).mean(dim=1)
        return self.head(torch.cat([pooled, self.dense(features)], dim=-1))


class DictOutput(nn.Module):
    """Returns a dict with more entries than the recipe deploys (as a ModelOutput does)."""

    def __init__(self, inputs: int = 16, hidden: int = 32, classes: int = 5):
        super().__init__()
        self.body = nn.Sequential(nn.Linear(inputs, hidden), nn.ReLU(), nn.Linear(hidden, hidden))
        self.head = nn.Linear(hidden, classes)

    def forward(self, x: torch.Tensor) -> dict[str, torch.Tensor]:
        hidden = self.body(x)
        logits = self.head(hidden)
        return {"hidden": hidden, "logits": logits, "probabilities": logits.softmax(-1)}


class RecurrentTagger(nn.Module):
    """A recurrent sequence tagger: a bidirectional LSTM and a GRU over float features, returning per-step tag
    logits, one score per step ([batch, sequence]: 2-D, but no embedding) and a learned temperature that does
    not depend on the batch (the exporters fold it into a constant output). The dynamo exporter bakes the
    example's sequence length into a Reshape of this graph: the export must notice and fall back."""

    def __init__(self, features: int = 12, hidden: int = 24, tags: int = 7):
        super().__init__()
        self.rnn = nn.LSTM(features, hidden, num_layers=2, batch_first=True, bidirectional=True)
        self.gru = nn.GRU(2 * hidden, hidden, batch_first=True)
        self.head = nn.Linear(hidden, tags)
        self.temperature = nn.Parameter(torch.tensor([0.7]))

    def forward(self, features: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        states, _ = self.rnn(features)
        out, _ = self.gru(states)
        tags = self.head(out)
        return tags, tags.logsumexp(-1), self.temperature * 1.0


def recurrent_tagger(**kwargs: int) -> nn.Module:
    return RecurrentTagger(**kwargs)


def tokens_and_features(**kwargs: int) -> nn.Module:
    return TokensAndFeatures(**kwargs)


def dict_output(**kwargs: int) -> nn.Module:
    return DictOutput(**kwargs)


def bert_base() -> nn.Module:
    """BERT-base at transformers' default config (110 M parameters): the GPU zoo's transformer."""
    from transformers import BertConfig, BertModel

    return BertModel(BertConfig())
