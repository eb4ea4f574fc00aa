"""Models ``pace profile --model`` knows: torchvision classifiers and two built-in sequence models.

``torchvision:NAME`` builds any torchvision classification model with random weights
(``weights=None``: nothing is downloaded) on random images. ``pace:transformer`` is a GPT-like
decoder (token + position embeddings, pre-LN blocks, tied output head; 12 blocks of width 512:
148 parameter tensors, 46 M parameters) and ``pace:lstm-seq2seq`` an encoder-decoder LSTM in
the style of the PACE paper's Seq2Seq (4 + 4 layers of width 512: 36 tensors, 41 M
parameters), both on random tokens. ``pace:vgg-cifar`` is VGG-16 for 32x32 images (13
convolutions + one linear classifier, 28 tensors, 14.7 M parameters): VGG's layout, where the
late layers hold most of the bytes, at a size one CPU core trains in well under a second.
Inputs are made once, so every iteration runs the same ops.
"""

from __future__ import annotations

import difflib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn
from torch.nn import functional as F  # noqa: N812 - the usual torch spelling

from pace.errors import InputError

BUILTINS: tuple[str, ...] = ("pace:transformer", "pace:lstm-seq2seq", "pace:vgg-cifar")

# VGG-16 ("configuration D"): (channels, 3x3 convolutions) per stage; a 2x2 max-pool after each.
_VGG16_STAGES: tuple[tuple[int, int], ...] = ((64, 2), (128, 2), (256, 3), (512, 3), (512, 3))


@dataclass(frozen=True, kw_only=True, slots=True)
class Workload:
    """A model, its training step (forward + loss) and an optimizer, ready to profile."""

    name: str
    model: nn.Module
    step_fn: Callable[[nn.Module], torch.Tensor]
    optimizer: torch.optim.Optimizer
    details: Mapping[str, Any] = field(default_factory=dict)


class _Block(nn.Module):
    def __init__(self, d_model: int, n_heads: int) -> None:
        super().__init__()
        self.n_heads = n_heads
        self.ln1 = nn.LayerNorm(d_model)
        self.qkv = nn.Linear(d_model, 3 * d_model)
        self.proj = nn.Linear(d_model, d_model)
        self.ln2 = nn.LayerNorm(d_model)
        self.fc1 = nn.Linear(d_model, 4 * d_model)
        self.fc2 = nn.Linear(4 * d_model, d_model)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(d, dim=-1)
        h = self.n_heads

        def heads(t: torch.Tensor) -> torch.Tensor:
            return t.reshape(b, s, h, d // h).transpose(1, 2)

        att = F.scaled_dot_product_attention(heads(q), heads(k), heads(v), is_causal=True)
        x = x + self.proj(att.transpose(1, 2).reshape(b, s, d))
        out: torch.Tensor = x + self.fc2(F.gelu(self.fc1(self.ln2(x))))
        return out


class TinyGPT(nn.Module):
    """GPT-like decoder; the output head shares the token embedding (tied weights)."""

    def __init__(
        self, *, vocab: int = 16000, d_model: int = 512, n_layers: int = 12, n_heads: int = 8
    ) -> None:
        super().__init__()
        self.tok = nn.Embedding(vocab, d_model)
        self.pos = nn.Embedding(1024, d_model)
        self.blocks = nn.ModuleList(_Block(d_model, n_heads) for _ in range(n_layers))
        self.ln_f = nn.LayerNorm(d_model)
        self.head = nn.Linear(d_model, vocab, bias=False)
        self.head.weight = self.tok.weight

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        pos = torch.arange(idx.shape[1], device=idx.device)
        x = self.tok(idx) + self.pos(pos)
        for blk in self.blocks:
            x = blk(x)
        out: torch.Tensor = self.head(self.ln_f(x))
        return out


class Seq2Seq(nn.Module):
    """Encoder-decoder LSTM (Sutskever et al.) with a linear output layer."""

    def __init__(
        self, *, vocab: int = 16000, d_model: int = 512, n_layers: int = 4, tie: bool = False
    ) -> None:
        super().__init__()
        self.src_emb = nn.Embedding(vocab, d_model)
        self.tgt_emb = nn.Embedding(vocab, d_model)
        self.encoder = nn.LSTM(d_model, d_model, num_layers=n_layers, batch_first=True)
        self.decoder = nn.LSTM(d_model, d_model, num_layers=n_layers, batch_first=True)
        self.out = nn.Linear(d_model, vocab)
        if tie:
            self.out.weight = self.tgt_emb.weight

    def forward(self, src: torch.Tensor, tgt: torch.Tensor) -> torch.Tensor:
        _, state = self.encoder(self.src_emb(src))
        dec, _ = self.decoder(self.tgt_emb(tgt), state)
        out: torch.Tensor = self.out(dec)
        return out


def vgg_cifar(num_classes: int = 10) -> nn.Sequential:
    """VGG-16 for 32x32 inputs: the 13 convolutions of VGG-16, then one linear classifier."""
    layers: list[nn.Module] = []
    channels = 3
    for width, convs in _VGG16_STAGES:
        for _ in range(convs):
            layers += [nn.Conv2d(channels, width, 3, padding=1), nn.ReLU(inplace=True)]
            channels = width
        layers.append(nn.MaxPool2d(2))
    return nn.Sequential(*layers, nn.Flatten(), nn.Linear(channels, num_classes))


def _sgd(model: nn.Module) -> torch.optim.Optimizer:
    return torch.optim.SGD(model.parameters(), lr=1e-3, momentum=0.9)


def _torchvision(
    name: str, *, batch_size: int, image_size: int, num_classes: int, device: str, seed: int
) -> Workload:
    try:
        import torchvision
    except ImportError as exc:
        raise InputError("torchvision is not installed", field="model") from exc
    available = sorted(torchvision.models.list_models(module=torchvision.models))
    if name not in available:
        close = difflib.get_close_matches(name, available, n=3)
        hint = f" (did you mean {', '.join(close)}?)" if close else ""
        raise InputError(f"unknown torchvision classification model {name!r}{hint}", field="model")
    kwargs: dict[str, Any] = {"weights": None, "num_classes": num_classes}
    if name.startswith(("inception", "googlenet")):
        kwargs["aux_logits"] = False  # the aux heads change the loss; not part of the DAG
        kwargs["init_weights"] = False
    model = torchvision.models.get_model(name, **kwargs).to(device)
    g = torch.Generator().manual_seed(seed)
    images = torch.randn(batch_size, 3, image_size, image_size, generator=g).to(device)
    labels = torch.randint(0, num_classes, (batch_size,), generator=g).to(device)

    def step(m: nn.Module) -> torch.Tensor:
        out = m(images)
        logits = out.logits if hasattr(out, "logits") else out
        return F.cross_entropy(logits, labels)

    return Workload(
        name=f"torchvision:{name}",
        model=model,
        step_fn=step,
        optimizer=_sgd(model),
        details={"batch_size": batch_size, "image_size": image_size, "num_classes": num_classes},
    )


def build_workload(
    spec: str,
    *,
    batch_size: int,
    image_size: int = 224,
    seq_len: int = 64,
    num_classes: int = 1000,
    device: str = "cpu",
    seed: int = 0,
) -> Workload:
    """The workload ``spec`` names.

    ``torchvision:NAME``, ``pace:transformer`` or ``pace:lstm-seq2seq``.
    """
    if batch_size < 1:
        raise InputError(f"must be >= 1, got {batch_size}", field="batch_size")
    if image_size < 16:
        raise InputError(f"must be >= 16, got {image_size}", field="image_size")
    if seq_len < 2:
        raise InputError(f"must be >= 2, got {seq_len}", field="seq_len")
    torch.manual_seed(seed)
    family, _, name = spec.partition(":")
    if family == "torchvision" and name:
        return _torchvision(
            name,
            batch_size=batch_size,
            image_size=image_size,
            num_classes=num_classes,
            device=device,
            seed=seed,
        )
    g = torch.Generator().manual_seed(seed)
    if spec == "pace:transformer":
        gpt = TinyGPT().to(device)
        vocab = gpt.tok.num_embeddings
        tokens = torch.randint(0, vocab, (batch_size, seq_len + 1), generator=g).to(device)

        def gpt_step(m: nn.Module) -> torch.Tensor:
            logits = m(tokens[:, :-1])
            return F.cross_entropy(logits.reshape(-1, vocab), tokens[:, 1:].reshape(-1))

        return Workload(
            name=spec,
            model=gpt,
            step_fn=gpt_step,
            optimizer=_sgd(gpt),
            details={"batch_size": batch_size, "seq_len": seq_len, "vocab": vocab},
        )
    if spec == "pace:vgg-cifar":
        vgg = vgg_cifar(num_classes).to(device)
        images = torch.randn(batch_size, 3, 32, 32, generator=g).to(device)
        labels = torch.randint(0, num_classes, (batch_size,), generator=g).to(device)

        def vgg_step(m: nn.Module) -> torch.Tensor:
            return F.cross_entropy(m(images), labels)

        return Workload(
            name=spec,
            model=vgg,
            step_fn=vgg_step,
            optimizer=_sgd(vgg),
            details={"batch_size": batch_size, "image_size": 32, "num_classes": num_classes},
        )
    if spec == "pace:lstm-seq2seq":
        s2s = Seq2Seq().to(device)
        vocab = s2s.out.out_features
        src = torch.randint(0, vocab, (batch_size, seq_len), generator=g).to(device)
        tgt = torch.randint(0, vocab, (batch_size, seq_len + 1), generator=g).to(device)

        def s2s_step(m: nn.Module) -> torch.Tensor:
            logits = m(src, tgt[:, :-1])
            return F.cross_entropy(logits.reshape(-1, vocab), tgt[:, 1:].reshape(-1))

        return Workload(
            name=spec,
            model=s2s,
            step_fn=s2s_step,
            optimizer=_sgd(s2s),
            details={"batch_size": batch_size, "seq_len": seq_len, "vocab": vocab},
        )
    raise InputError(
        f"unknown model {spec!r}: use torchvision:NAME (e.g. torchvision:resnet50) or one of "
        + ", ".join(BUILTINS),
        field="model",
    )
