"""``pace profile`` vs ``torch.profiler`` + execution trace -> ``pace import``, on the same models.

    python benchmarks/bench_import.py [--models mlp,wide,cnn,quirks,gpt,lstm] [--iters 3]
                                      [--rounds 3] [--timing span|kernel] [--speedups 1,10]
                                      [--markdown]
    python benchmarks/bench_import.py --models torchvision:resnet50,torchvision:densenet121,...

Each model is profiled both ways on this CPU with one torch thread, alternately (``--rounds``
times each, so the machine's load falls on both alike); every time reported is the median over
the rounds of its side, and the structure must agree in every round. The table says whether the
two traces have the same gradient tensors (names and bytes), the same ops, producers, consumers
and edges (as op positions: the op names differ only in their module part), the per-phase totals
of both, and the iteration time the compiler predicts for each under the same cost model (8
workers, 10 Gbps, 50 us per call) with the computation as profiled (``x1``) and ``X`` times
faster (``--speedups``)."""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import sys
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from rich.console import Console
from rich.table import Table

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch
from torch import nn
from torch.nn import functional as F  # noqa: N812 - the usual torch spelling

from pace.importer import import_trace, record
from pace.importer.agree import Agreement, compare_traces
from pace.ir import Trace
from pace.profiler import profile
from pace.profiler.workloads import Seq2Seq, TinyGPT

MODELS: tuple[str, ...] = ("mlp", "wide", "cnn", "quirks", "gpt", "lstm")


@dataclass(frozen=True)
class Model:
    name: str
    model: nn.Module
    step_fn: Callable[[nn.Module], torch.Tensor]
    optimizer: torch.optim.Optimizer


def build(name: str) -> Model:
    """Small models of the four families, a few ms to tens of ms per step on one core;
    ``torchvision:NAME`` is that classifier on 2 random 64x64 images (``pace profile``'s
    workload)."""
    if name.startswith("torchvision:"):
        from pace.profiler import build_workload

        w = build_workload(name, batch_size=2, image_size=64, num_classes=10)
        return Model(name=name, model=w.model, step_fn=w.step_fn, optimizer=w.optimizer)
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(0)
    model: nn.Module
    if name == "mlp":
        model = nn.Sequential(
            nn.Linear(256, 512), nn.ReLU(), nn.Linear(512, 512), nn.ReLU(), nn.Linear(512, 10)
        )
        x = torch.randn(64, 256, generator=g)
        y = torch.randint(0, 10, (64,), generator=g)

        def step(m: nn.Module) -> torch.Tensor:
            return F.cross_entropy(m(x), y)

    elif name == "wide":  # few large matmuls: compute-bound, little per-op overhead
        model = nn.Sequential(
            nn.Linear(1024, 1024), nn.ReLU(), nn.Linear(1024, 1024), nn.ReLU(), nn.Linear(1024, 10)
        )
        x = torch.randn(256, 1024, generator=g)
        y = torch.randint(0, 10, (256,), generator=g)

        def step(m: nn.Module) -> torch.Tensor:
            return F.cross_entropy(m(x), y)

    elif name == "cnn":  # conv, batch norm (buffers), residual add
        model = _ResNetish()
        x = torch.randn(8, 3, 32, 32, generator=g)
        y = torch.randint(0, 10, (8,), generator=g)

        def step(m: nn.Module) -> torch.Tensor:
            return F.cross_entropy(m(x), y)

    elif name == "quirks":  # what the execution trace records differently from pace profile
        model = _Quirks()
        x = torch.randn(4, 3, 8, 8, generator=g)
        y = torch.randint(0, 10, (4,), generator=g)

        def step(m: nn.Module) -> torch.Tensor:
            return F.cross_entropy(m(x), y)

    elif name == "gpt":  # layer norm, attention, tied embedding/head
        model = TinyGPT(vocab=512, d_model=64, n_layers=2, n_heads=4)
        tokens = torch.randint(0, 512, (4, 33), generator=g)

        def step(m: nn.Module) -> torch.Tensor:
            logits = m(tokens[:, :-1])
            return F.cross_entropy(logits.reshape(-1, 512), tokens[:, 1:].reshape(-1))

    elif name == "lstm":  # LSTM layers: several same-shape parameters per op
        model = Seq2Seq(vocab=256, d_model=64, n_layers=2)
        src = torch.randint(0, 256, (4, 12), generator=g)
        tgt = torch.randint(0, 256, (4, 13), generator=g)

        def step(m: nn.Module) -> torch.Tensor:
            logits = m(src, tgt[:, :-1])
            return F.cross_entropy(logits.reshape(-1, 256), tgt[:, 1:].reshape(-1))

    else:
        raise SystemExit(f"unknown model {name!r}: use {', '.join(MODELS)}")
    opt = torch.optim.SGD(model.parameters(), lr=1e-3, momentum=0.9)
    return Model(name=name, model=model, step_fn=step, optimizer=opt)


class _ResNetish(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.stem = nn.Conv2d(3, 32, 3, padding=1, bias=False)
        self.bn0 = nn.BatchNorm2d(32)
        self.conv1 = nn.Conv2d(32, 32, 3, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(32)
        self.conv2 = nn.Conv2d(32, 32, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(32)
        self.fc = nn.Linear(32, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = F.relu(self.bn0(self.stem(x)))
        h = h + self.bn2(self.conv2(F.relu(self.bn1(self.conv1(h)))))
        out: torch.Tensor = self.fc(F.relu(h).mean(dim=(2, 3)))
        return out


class _Quirks(nn.Module):
    """An in-place op whose autograd kernel clones its input first (``hardswish_``), an in-place
    op on a view (autograd's ``CopySlices``), a no-op ``to``, a parameter read twice."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3, padding=1)
        self.bn = nn.BatchNorm2d(8)
        self.act = nn.Hardswish(inplace=True)
        self.scale = nn.Parameter(torch.ones(8))
        self.fc = nn.Linear(8, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.act(self.bn(self.conv(x)))
        h[:, :4] *= 2.0  # in place on a view of h
        h = h.to(torch.float32) * self.scale.view(1, 8, 1, 1)
        pooled = h.mean(dim=(2, 3)) + self.scale
        out: torch.Tensor = self.fc(pooled)
        return out


def profile_both(
    m: Model,
    workdir: Path,
    *,
    iters: int = 3,
    warmup: int = 1,
    rounds: int = 1,
    timing: str = "span",
) -> list[tuple[Trace, Trace]]:
    """``rounds`` pairs (pace profile trace, pace import trace), taken alternately."""
    pairs = []
    for r in range(rounds):
        profiled = profile(
            m.model,
            m.step_fn,
            iters=iters,
            warmup=warmup,
            optimizer=m.optimizer,
            timing=timing,
        )
        files = record(
            m.model,
            m.step_fn,
            kineto=workdir / f"{m.name}.{r}.kineto.json",
            execution_trace=workdir / f"{m.name}.{r}.et.json",
            optimizer=m.optimizer,
            iters=iters,
            warmup=warmup,
        )
        imported = import_trace(files.kineto, execution_trace=files.execution_trace, timing=timing)
        pairs.append((profiled, imported.trace))
    return pairs


def median_agreement(agree: list[Agreement]) -> Agreement:
    """One agreement for several rounds: structure must hold in every round; each time is the
    median over the rounds of that side (rounds share the machine's load, not its noise)."""

    def med(pairs: list[tuple[float, float]]) -> tuple[float, float]:
        return (
            statistics.median(p[0] for p in pairs),
            statistics.median(p[1] for p in pairs),
        )

    return dataclasses.replace(
        agree[0],
        tensors_equal=all(a.tensors_equal for a in agree),
        tensor_order_equal=all(a.tensor_order_equal for a in agree),
        ops_equal=all(a.ops_equal for a in agree),
        links_equal=all(a.links_equal for a in agree),
        deps_equal=all(a.deps_equal for a in agree),
        forward_us=med([a.forward_us for a in agree]),
        backward_us=med([a.backward_us for a in agree]),
        predicted_us=med([a.predicted_us for a in agree]),
    )


def rows(name: str, agree: list[Agreement], plain: tuple[float, float]) -> list[list[str]]:
    """Table rows of one model: one per compute speed-up. ``plain``: the uninstrumented
    (forward, backward) pass times pace profile measured beside its own (``meta``)."""
    a = agree[0]

    def yes(x: bool) -> str:
        return "yes" if x else "NO"

    def ms(pair: tuple[float, float], ref: float) -> str:
        return f"{pair[0] / 1e3:.2f} / {pair[1] / 1e3:.2f} / {ref / 1e3:.2f}"

    out = []
    for k, ag in enumerate(agree):
        first = [
            name,
            yes(a.tensors_equal and a.tensor_order_equal),
            yes(a.ops_equal and a.links_equal and a.deps_equal),
            ms(a.forward_us, plain[0]),
            f"{Agreement.rel(a.forward_us):+.1%}",
            ms(a.backward_us, plain[1]),
            f"{Agreement.rel(a.backward_us):+.1%}",
        ]
        out.append(
            [
                *(first if k == 0 else [""] * len(first)),
                f"x{ag.compute_speedup:g}",
                f"{ag.predicted_us[0] / 1e3:.2f} / {ag.predicted_us[1] / 1e3:.2f}",
                f"{Agreement.rel(ag.predicted_us):+.1%}",
            ]
        )
    return out


COLUMNS = [
    "model",
    "tensors+bytes",
    "ops+links+edges",
    "fw ms profile / import / plain",
    "fw import vs profile",
    "bw ms profile / import / plain",
    "bw import vs profile",
    "compute",
    "predicted ms profile / import",
    "predicted diff",
]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    ap.add_argument(
        "--models", default=",".join(MODELS), help="also torchvision:NAME (2 images of 64x64)"
    )
    ap.add_argument("--iters", type=int, default=3)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--speedups", default="1,10")
    ap.add_argument("--timing", default="span", choices=("span", "kernel"), help="on both sides")
    ap.add_argument("--markdown", action="store_true")
    args = ap.parse_args()
    torch.set_num_threads(1)
    table_rows: list[list[str]] = []
    with tempfile.TemporaryDirectory() as tmp:
        for name in args.models.split(","):
            m = build(name)
            pairs = profile_both(
                m, Path(tmp), iters=args.iters, rounds=args.rounds, timing=args.timing
            )
            agree = [
                median_agreement([compare_traces(p, i, compute_speedup=float(x)) for p, i in pairs])
                for x in args.speedups.split(",")
            ]
            plain = (
                statistics.median(p.meta["uninstrumented_forward_us"] for p, _ in pairs),
                statistics.median(p.meta["uninstrumented_backward_us"] for p, _ in pairs),
            )
            table_rows += rows(name, agree, plain)
    if args.markdown:
        print("| " + " | ".join(COLUMNS) + " |")
        print("|" + "---|" * len(COLUMNS))
        for r in table_rows:
            print("| " + " | ".join(r) + " |")
        return
    title = f"pace profile vs pace import (torch.profiler + execution trace), {args.timing} timing"
    table = Table(title=title)
    for c in COLUMNS:
        table.add_column(c)
    for r in table_rows:
        table.add_row(*r)
    Console(width=200).print(table)


if __name__ == "__main__":
    main()
