"""All-reduce cost models: the linear model, PACE's ring formula, fitting, what-if rescaling.

Every model pace uses is linear in the message size, ``cost_us(S) = alpha_us +
beta_us_per_byte * S`` (``pace.ir.CommModel``): a per-call latency plus a per-byte cost.

**Ring formula (PACE Eqn. 1).** With ``W`` workers, link bandwidth ``B`` and reduction speed
``G``, a ring all-reduce of ``S`` bytes sends ``2(W-1)`` chunks of ``S/W`` bytes and sums ``W-1``
of them::

    g(S) = (S/W)·2(W-1)/B + (S/W)·(W-1)/G

PACE has no latency term; pace adds a per-call latency ``alpha_us`` (framework negotiation,
kernel launch, synchronisation), which is what makes fusion worthwhile. The formula is linear in
``S``, so it is exactly a ``CommModel`` with ``beta = (W-1)/W · (2/B + 1/G)``.

Units: bandwidth in Gbit/s (``bandwidth_gbps``; 1 Gbit/s = 125 bytes/us), reduction speed in
GB/s (``reduce_gbytes_per_s``; 1 GB/s = 1000 bytes/us).

**What-if** (``what_if``): ``--workers`` rescales the per-byte cost by ``((W'-1)/W') /
((W-1)/W)``; both terms of Eqn. 1 carry that factor, so the rescaling is exact whatever the
(unknown) split between transmission and reduction in the measured ``beta``. ``--bandwidth-gbps``
cannot be a rescaling, because a trace does not record the bandwidth its ``beta`` was measured at;
instead ``beta`` is *replaced* by the transmission term of Eqn. 1 at the given bandwidth, plus the
reduction term if ``reduce_gbytes_per_s`` is given (otherwise reduction is assumed free next to
the network, the regime in which communication scheduling matters). ``alpha_us`` is kept in both
cases: on the clusters pace targets it is dominated by per-call software overhead, not by the
``2(W-1)`` per-step link latencies (which a ring would add per worker); this under-estimates the
latency of very large rings, a bias documented rather than guessed at.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from pace.bounds import MAX_BETA_US_PER_BYTE, MAX_DURATION_US, MAX_TENSOR_BYTES, MIN_NONZERO_US
from pace.checks import require_int, require_number
from pace.errors import InputError
from pace.ir import CommModel

BYTES_PER_US_PER_GBPS = 1e9 / 8 / 1e6  # 1 Gbit/s = 125 bytes per microsecond
BYTES_PER_US_PER_GBYTES_PER_S = 1e3  # 1 GB/s = 1000 bytes per microsecond


def _positive(value: float, option: str) -> float:
    return require_number(value, where=option, above=0)


def _workers(value: int, option: str) -> int:
    return require_int(value, where=option, minimum=1)


def _nonneg(value: float, option: str) -> float:
    return require_number(value, where=option, minimum=0)


def ring_beta_us_per_byte(
    *, workers: int, bandwidth_gbps: float, reduce_gbytes_per_s: float | None = None
) -> float:
    """Per-byte cost of a ring all-reduce, PACE Eqn. 1 divided by ``S``.

    ``reduce_gbytes_per_s=None`` leaves out the reduction term (reduction treated as free).

    >>> round(ring_beta_us_per_byte(workers=2, bandwidth_gbps=10), 6)  # (1/2)*2/1250
    0.0008
    """
    w = _workers(workers, "--workers")
    b_bytes_per_us = _positive(bandwidth_gbps, "--bandwidth-gbps") * BYTES_PER_US_PER_GBPS
    share = (w - 1) / w
    beta = share * 2.0 / b_bytes_per_us
    if reduce_gbytes_per_s is not None:
        g = _positive(reduce_gbytes_per_s, "--reduce-gbytes-per-s") * BYTES_PER_US_PER_GBYTES_PER_S
        beta += share / g
    return beta


def ring_allreduce_us(
    size_bytes: float,
    *,
    workers: int,
    bandwidth_gbps: float,
    reduce_gbytes_per_s: float | None = None,
    latency_us: float = 0.0,
) -> float:
    """Duration of one ring all-reduce of ``size_bytes``: ``latency_us`` + PACE Eqn. 1.

    >>> # 8 Gbit/s = 1000 B/us, 1 GB/s = 1000 B/us: (1000/4)*6/1000 + (1000/4)*3/1000
    >>> round(ring_allreduce_us(1000, workers=4, bandwidth_gbps=8, reduce_gbytes_per_s=1), 9)
    2.25
    """
    beta = ring_beta_us_per_byte(
        workers=workers, bandwidth_gbps=bandwidth_gbps, reduce_gbytes_per_s=reduce_gbytes_per_s
    )
    return _nonneg(latency_us, "--latency-us") + beta * size_bytes


def ring_comm_model(
    *,
    workers: int,
    bandwidth_gbps: float,
    reduce_gbytes_per_s: float | None = None,
    latency_us: float = 0.0,
) -> CommModel:
    """The ``CommModel`` equal to ``ring_allreduce_us`` for every size."""
    return CommModel(
        workers=_workers(workers, "--workers"),
        alpha_us=_nonneg(latency_us, "--latency-us"),
        beta_us_per_byte=ring_beta_us_per_byte(
            workers=workers,
            bandwidth_gbps=bandwidth_gbps,
            reduce_gbytes_per_s=reduce_gbytes_per_s,
        ),
        algorithm="ring",
    )


# ---------------------------------------------------------------------------------------------
# Fitting


@dataclass(frozen=True, kw_only=True, slots=True)
class FitQuality:
    """How well ``alpha + beta*bytes`` explains the samples.

    ``r2`` is the coefficient of determination on the raw durations; the relative errors are
    ``|predicted - measured| / measured`` over samples with a positive measurement.
    """

    n_samples: int
    r2: float
    mean_rel_error: float
    median_rel_error: float
    max_rel_error: float


def fit_linear(
    samples: Sequence[tuple[int, float]], *, workers: int, algorithm: str = "ring"
) -> tuple[CommModel, FitQuality]:
    """Fit ``alpha_us + beta_us_per_byte * bytes`` to measured ``(bytes, us)`` samples.

    Least squares on *relative* residuals (each sample weighted by ``1/us``): all-reduce
    benchmarks span several orders of magnitude of size, and timing noise is roughly
    proportional to duration, so unweighted least squares would let the largest messages decide
    ``alpha`` alone. Both coefficients are constrained to be >= 0 (``scipy.optimize.lsq_linear``),
    since a negative latency or per-byte cost is not a model any scheduler can use. If any
    sample measured 0 us, the fit falls back to unweighted least squares.

    The returned model keeps the samples (they are written to the trace's ``comm.samples``).
    Raises ``InputError`` (``where="samples"``) for fewer than two distinct sizes or bad values.
    """
    from scipy.optimize import lsq_linear

    w = _workers(workers, "workers")
    pts: list[tuple[int, float]] = []
    for i, pt in enumerate(samples):
        if len(pt) != 2:
            raise InputError(
                f"must be a (bytes, us) pair, got {pt!r}", where="samples", field=f"[{i}]"
            )
        b, us = pt
        b = require_int(b, where="samples", field=f"[{i}]", name="bytes", minimum=0)
        us = require_number(us, where="samples", field=f"[{i}]", name="us", minimum=0)
        # The trace bounds (pace.io): a subnormal time would make the 1/us weight infinite.
        if b > MAX_TENSOR_BYTES or us > MAX_DURATION_US or 0 < us < MIN_NONZERO_US:
            raise InputError(
                f"must be bytes <= {MAX_TENSOR_BYTES} and us 0 or in [{MIN_NONZERO_US:g}, "
                f"{MAX_DURATION_US:g}], got {pt!r}",
                where="samples",
                field=f"[{i}]",
            )
        pts.append((b, float(us)))
    if len({b for b, _ in pts}) < 2:
        raise InputError("need samples at two or more distinct sizes to fit", where="samples")

    x = np.array([b for b, _ in pts], dtype=float)
    y = np.array([us for _, us in pts], dtype=float)
    weight = 1.0 / y if np.all(y > 0) else np.ones_like(y)
    # Scale the bytes column so both unknowns are of similar magnitude (conditioning).
    x_scale = float(np.max(x)) or 1.0
    design = np.column_stack([np.ones_like(x), x / x_scale]) * weight[:, None]
    try:
        result = lsq_linear(design, y * weight, bounds=(0.0, np.inf), method="bvls")
    except (np.linalg.LinAlgError, ValueError) as exc:
        raise InputError(f"cannot fit these samples: {exc}", where="samples") from None
    alpha = float(result.x[0])
    beta = float(result.x[1]) / x_scale
    if not (alpha <= MAX_DURATION_US and beta <= MAX_BETA_US_PER_BYTE):
        raise InputError(
            f"the fit (alpha {alpha:g} us, beta {beta:g} us/byte) is beyond the trace bounds "
            f"(alpha <= {MAX_DURATION_US:g}, beta <= {MAX_BETA_US_PER_BYTE:g})",
            where="samples",
        )

    pred = alpha + beta * x
    ss_res = float(np.sum((y - pred) ** 2))
    ss_tot = float(np.sum((y - np.mean(y)) ** 2))
    r2 = 1.0 - ss_res / ss_tot if ss_tot > 0 else (1.0 if ss_res == 0 else 0.0)
    pos = y > 0
    rel = np.abs(pred[pos] - y[pos]) / y[pos] if np.any(pos) else np.zeros(1)
    quality = FitQuality(
        n_samples=len(pts),
        r2=r2,
        mean_rel_error=float(np.mean(rel)),
        median_rel_error=float(np.median(rel)),
        max_rel_error=float(np.max(rel)),
    )
    model = CommModel(
        workers=w,
        alpha_us=alpha,
        beta_us_per_byte=beta,
        algorithm=algorithm,
        samples=tuple(pts),
    )
    return model, quality


# ---------------------------------------------------------------------------------------------
# What-if


@dataclass(frozen=True, kw_only=True, slots=True)
class WhatIf:
    """What-if overrides of a trace's communication model (CLI ``--bandwidth-gbps``,
    ``--workers``, ``--reduce-gbytes-per-s``). ``None`` keeps the trace's value.

    Validated on construction; messages name the CLI option.
    """

    bandwidth_gbps: float | None = None
    workers: int | None = None
    reduce_gbytes_per_s: float | None = None

    def __post_init__(self) -> None:
        if self.bandwidth_gbps is not None:
            _positive(self.bandwidth_gbps, "--bandwidth-gbps")
        if self.workers is not None:
            _workers(self.workers, "--workers")
        if self.reduce_gbytes_per_s is not None:
            _positive(self.reduce_gbytes_per_s, "--reduce-gbytes-per-s")
            if self.bandwidth_gbps is None:
                raise InputError(
                    "only applies together with --bandwidth-gbps "
                    "(the measured beta already includes reduction)",
                    where="--reduce-gbytes-per-s",
                )

    @property
    def is_identity(self) -> bool:
        return self.bandwidth_gbps is None and self.workers is None


def what_if(
    comm: CommModel,
    *,
    bandwidth_gbps: float | None = None,
    workers: int | None = None,
    reduce_gbytes_per_s: float | None = None,
) -> CommModel:
    """``comm`` as it would be with another bandwidth and/or worker count (module docstring).

    The result drops ``samples`` (they were measured under the old conditions) unless nothing
    changed, in which case ``comm`` itself is returned.

    >>> m = CommModel(workers=2, alpha_us=20.0, beta_us_per_byte=0.001)
    >>> what_if(m, workers=8).beta_us_per_byte  # (7/8) / (1/2) = 1.75x
    0.00175
    >>> round(what_if(m, bandwidth_gbps=25, workers=4).beta_us_per_byte, 8)  # (3/4)*2/3125
    0.00048
    """
    opts = WhatIf(
        bandwidth_gbps=bandwidth_gbps, workers=workers, reduce_gbytes_per_s=reduce_gbytes_per_s
    )
    if opts.is_identity:
        return comm
    new_w = opts.workers if opts.workers is not None else comm.workers
    if opts.bandwidth_gbps is not None:
        beta = ring_beta_us_per_byte(
            workers=new_w,
            bandwidth_gbps=opts.bandwidth_gbps,
            reduce_gbytes_per_s=opts.reduce_gbytes_per_s,
        )
    else:
        if comm.workers < 2 and new_w != comm.workers:
            raise InputError(
                f"cannot rescale a comm model measured with {comm.workers} worker "
                "(no communication to scale); give --bandwidth-gbps as well",
                where="--workers",
            )
        old_share = (comm.workers - 1) / comm.workers
        new_share = (new_w - 1) / new_w
        beta = comm.beta_us_per_byte * (new_share / old_share) if old_share else 0.0
    # The interference term is what this machine's compute loses to its communication, and the
    # update and the copy-back are its compute: all kept as measured (a what-if moves the link,
    # not the cores).
    return CommModel(
        workers=new_w,
        alpha_us=comm.alpha_us,
        beta_us_per_byte=beta,
        algorithm=comm.algorithm,
        interference=comm.interference,
        update_us_per_byte=comm.update_us_per_byte,
        copy_us_per_byte=comm.copy_us_per_byte,
        # A per-call cost, as alpha (kept): a cycle's negotiation, not the link's bytes.
        batched_alpha_us=comm.batched_alpha_us,
    )
