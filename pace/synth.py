"""Random DNN-like traces: the generator behind property tests and size benchmarks.

A trace is a chain of ``n_layers`` layers. Each layer has one backward op (producing that
layer's gradient tensors) and one forward op (consuming them); ``ops_per_layer`` > 2 adds extra
computation ops per layer (activation, norm, ...) that carry no gradient. Optional skip edges make
the graph a real DAG (residual connections). The window is the backward pass of iteration k
(layers L..1) followed by the forward pass of iteration k+1 (layers 1..L), as in
docs/trace-format.md, so the Lemma-1 rule (no producer depends on a consumer) holds by
construction.
"""

from __future__ import annotations

import numpy as np

from pace.errors import InputError
from pace.ir import CommModel, Op, Tensor, Trace

# The shapes the property tests draw (tests/strategies.traces) and the benchmarks that measure
# over "traces drawn like the tests'" (benchmarks/bench_shared_channel.py): one list, so the two
# cannot drift apart.
TENSORS_PER_LAYER_CHOICES: tuple[tuple[int, int], ...] = ((1, 1), (1, 2), (0, 3), (1, 4))
SKIP_PROB_CHOICES: tuple[float, ...] = (0.0, 0.3, 0.7)
MIN_OPS_PER_LAYER = 2  # one backward op and one forward op


def random_trace(
    *,
    seed: int,
    n_layers: int = 10,
    tensors_per_layer: tuple[int, int] = (1, 2),
    ops_per_layer: int = 2,
    skip_prob: float = 0.2,
    integer: bool = False,
    alpha_us: float | None = None,
    beta_us_per_byte: float | None = None,
    workers: int = 8,
) -> Trace:
    """A valid random trace.

    ``integer=True`` gives integer durations and sizes with ``alpha_us = 0`` and
    ``beta_us_per_byte = 1`` (every all-reduce takes exactly ``bytes`` microseconds), the instances
    on which the time-slotted LP and the continuous exact solver must agree.
    ``tensors_per_layer`` is an inclusive range; a layer may get zero tensors only if the lower
    bound is 0.
    """
    if n_layers < 1:
        raise InputError(f"must be >= 1, got {n_layers}", field="n_layers")
    if ops_per_layer < MIN_OPS_PER_LAYER:
        raise InputError(
            f"must be >= 2 (one backward op and one forward op), got {ops_per_layer}",
            field="ops_per_layer",
        )
    rng = np.random.default_rng(seed)
    extra = ops_per_layer - 2
    # Half the extra ops go to backward, half to forward, so both passes have depth.
    extra_bw = extra // 2
    extra_fw = extra - extra_bw

    def duration() -> float:
        if integer:
            return float(rng.integers(1, 20))
        return float(np.exp(rng.uniform(np.log(5.0), np.log(3000.0))))

    ops: list[Op] = []
    tensors: list[Tensor] = []
    bw_main: dict[int, str] = {}
    prev: str | None = None
    # Backward of iteration k: last layer first.
    for layer in range(n_layers - 1, -1, -1):
        deps: list[str] = [prev] if prev else []
        skip_src = bw_main.get(layer + 2)
        if skip_src and rng.random() < skip_prob and skip_src not in deps:
            deps.append(skip_src)
        for j in range(extra_bw):
            name = f"bw.l{layer}.aux{j}"
            ops.append(Op(name=name, phase="backward", duration_us=duration(), deps=tuple(deps)))
            deps = [name]
        name = f"bw.l{layer}"
        ops.append(Op(name=name, phase="backward", duration_us=duration(), deps=tuple(deps)))
        bw_main[layer] = name
        prev = name
    # Forward of iteration k+1: first layer first.
    fw_main: dict[int, str] = {}
    for layer in range(n_layers):
        deps = [prev] if prev else []
        skip_src = fw_main.get(layer - 2)
        if skip_src and rng.random() < skip_prob and skip_src not in deps:
            deps.append(skip_src)
        name = f"fw.l{layer}"
        ops.append(Op(name=name, phase="forward", duration_us=duration(), deps=tuple(deps)))
        fw_main[layer] = name
        prev = name
        for j in range(extra_fw):
            aux = f"fw.l{layer}.aux{j}"
            ops.append(Op(name=aux, phase="forward", duration_us=duration(), deps=(prev,)))
            prev = aux

    lo, hi = tensors_per_layer
    for layer in range(n_layers):
        for j in range(int(rng.integers(lo, hi + 1))):
            if integer:
                size = int(rng.integers(1, 30))
            elif j == 0:
                # weights: log-uniform 1 KB .. 64 MB
                size = int(np.exp(rng.uniform(np.log(1e3), np.log(64e6)))) // 4 * 4 + 4
            else:
                # biases / norm params: tiny
                size = int(rng.integers(1, 4096)) * 4
            tensors.append(
                Tensor(
                    name=f"l{layer}.p{j}",
                    size_bytes=size,
                    producer=bw_main[layer],
                    consumers=(fw_main[layer],),
                )
            )
    if not tensors:
        # Always at least one gradient: a trace without one is not a data-parallel job.
        tensors.append(
            Tensor(name="l0.p0", size_bytes=4, producer=bw_main[0], consumers=(fw_main[0],))
        )

    if integer:
        comm = CommModel(workers=workers, alpha_us=0.0, beta_us_per_byte=1.0)
    else:
        # Default: ring all-reduce, 10 Gbps, `workers` workers; 2(W-1)/W bytes per byte sent.
        beta = (
            beta_us_per_byte
            if beta_us_per_byte is not None
            else 2 * (workers - 1) / workers * 8 / 10e3
        )
        alpha = alpha_us if alpha_us is not None else float(rng.uniform(0.0, 50.0))
        comm = CommModel(workers=workers, alpha_us=alpha, beta_us_per_byte=beta)
    return Trace(
        model=f"synthetic-{seed}",
        ops=tuple(ops),
        tensors=tuple(tensors),
        comm=comm,
        meta={"source": "pace.synth.random_trace", "seed": seed},
    )
