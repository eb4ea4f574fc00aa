"""Observed per-iteration statistics -> a re-estimated Trace.

The runtime's monitor (``pace.drift.monitor``) records, per iteration, the iteration time, the
forward and backward compute spans, each gradient's ready time and each all-reduce unit's
``(bytes, duration_us)``. ``ObservedStats`` is that record, with a JSON form (``stats.json``,
format ``pace.observed`` v1, documented in docs/drift.md) that ``pace recompile`` reads.

The estimate is deliberately coarse and robust:

* compute: one duration scale per phase (forward, backward) relative to the trace — drift in
  practice (a co-located job, thermal throttling, a slower node) scales a whole pass, and a scale
  per phase needs few samples to be stable;
* communication: ``(alpha_us, beta_us_per_byte)`` refitted from the observed units;
* jitter: every per-iteration quantity is reduced by a median over the window (robust to the odd
  slow step); an optional EWMA then smooths successive estimates for slow, continuous drift.

The median is over the iterations given: after a step change pass only iterations from after the
change (the controller passes the streak that fired the trigger), or the median still sees the
old regime.
"""

from __future__ import annotations

import bisect
import dataclasses
import json
import os
import statistics
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from pace.analysis import analyze
from pace.checks import is_number, require_int, require_number
from pace.errors import InputError
from pace.ir import CommModel, Op, Schedule, Trace

__all__ = [
    "OBSERVED_FORMAT",
    "Estimate",
    "EstimateOptions",
    "Estimator",
    "IterationStats",
    "ObservedStats",
    "TraceSpans",
    "apply_estimate",
    "estimate",
    "reestimate",
    "replayed_spans",
    "trace_spans",
    "warp_backward",
]

OBSERVED_FORMAT = "pace.observed"
SUPPORTED_OBSERVED_VERSIONS: tuple[int, ...] = (1,)

PathLike = str | os.PathLike[str]


# ---------------------------------------------------------------------------------------------
# The observed record


@dataclass(frozen=True, kw_only=True, slots=True)
class IterationStats:
    """What the monitor saw in one training iteration.

    Times are microseconds. ``grad_ready_us`` is relative to the start of the backward pass (the
    start of the trace's window). ``forward_us`` is forward *compute*: the forward span minus the
    time the forward pre-hooks spent blocked on communication, so that it is comparable with the
    trace's ideal-compute forward span. ``None`` means "not measured".
    """

    iteration: int
    iteration_us: float
    backward_us: float | None = None
    forward_us: float | None = None
    grad_ready_us: Mapping[str, float] = field(default_factory=dict)
    unit_samples: tuple[tuple[int, float], ...] = ()
    """``(bytes, duration_us)`` of each all-reduce call completed in this iteration."""


@dataclass(frozen=True, kw_only=True, slots=True)
class ObservedStats:
    """A window of observed iterations, oldest first (the ``stats.json`` file)."""

    iterations: tuple[IterationStats, ...]
    trace_digest: str = ""
    """Digest of the trace the running schedule was compiled from, if known."""
    meta: Mapping[str, Any] = field(default_factory=dict, compare=False, hash=False)

    def last(self, n: int) -> ObservedStats:
        """The same record restricted to its ``n`` most recent iterations."""
        if n <= 0:
            raise InputError(f"must be >= 1, got {n}", field="n")
        return dataclasses.replace(self, iterations=self.iterations[-n:])

    # -- JSON -------------------------------------------------------------------------------

    def to_dict(self) -> dict[str, Any]:
        its: list[dict[str, Any]] = []
        for it in self.iterations:
            its.append(
                {
                    "iteration": it.iteration,
                    "iteration_us": it.iteration_us,
                    "backward_us": it.backward_us,
                    "forward_us": it.forward_us,
                    "grad_ready_us": dict(it.grad_ready_us),
                    "units": [[b, d] for b, d in it.unit_samples],
                }
            )
        return {
            "format": OBSERVED_FORMAT,
            "version": 1,
            "trace_digest": self.trace_digest,
            "meta": dict(self.meta),
            "iterations": its,
        }

    @staticmethod
    def from_dict(obj: Any, *, where: str = "") -> ObservedStats:
        """Parse the ``stats.json`` object; raises ``InputError`` naming ``where`` and the field."""
        return _parse_observed(obj, where)

    def dump(self, path: PathLike) -> None:
        """Write ``stats.json`` (plain JSON; NaN is refused, as by the trace writer)."""
        try:
            text = json.dumps(self.to_dict(), allow_nan=False, ensure_ascii=False, indent=1)
        except (TypeError, ValueError) as exc:
            raise InputError(f"cannot write as JSON: {exc}", where=str(path)) from None
        from pace.io import write_atomic

        # A reader (pace recompile) sees the old file or the new one, never a half-written one.
        write_atomic(path, (text + "\n").encode("utf-8"))

    @staticmethod
    def load(path: PathLike) -> ObservedStats:
        """Read ``stats.json`` (strict JSON, gzip allowed); raises ``InputError``."""
        from pace.io import load_json

        return _parse_observed(load_json(path), str(path))


def _parse_observed(obj: Any, where: str) -> ObservedStats:
    def err(fieldname: str, message: str) -> InputError:
        return InputError(message, where=where, field=fieldname)

    if not isinstance(obj, dict):
        raise err("", "expected a JSON object")
    if obj.get("format") != OBSERVED_FORMAT:
        raise err("format", f"must be {OBSERVED_FORMAT!r}, got {obj.get('format')!r}")
    version = obj.get("version")
    if isinstance(version, bool) or version not in SUPPORTED_OBSERVED_VERSIONS:
        raise err(
            "version",
            f"unsupported version {version!r}; supported: {list(SUPPORTED_OBSERVED_VERSIONS)}",
        )
    digest = obj.get("trace_digest", "")
    if not isinstance(digest, str):
        raise err("trace_digest", "must be a string")
    meta = obj.get("meta", {})
    if not isinstance(meta, dict):
        raise err("meta", "must be an object")
    raw_its = obj.get("iterations")
    if not isinstance(raw_its, list):
        raise err("iterations", "must be a list")

    def num(v: Any, path: str, *, optional: bool = False) -> float | None:
        if v is None and optional:
            return None
        if not is_number(v, finite=True) or v < 0:
            raise err(path, f"must be a finite number >= 0, got {v!r}")
        return float(v)

    its: list[IterationStats] = []
    for i, raw in enumerate(raw_its):
        p = f"iterations[{i}]"
        if not isinstance(raw, dict):
            raise err(p, "must be an object")
        index = require_int(raw.get("iteration"), where=where, field=f"{p}.iteration")
        iteration_us = num(raw.get("iteration_us"), f"{p}.iteration_us")
        assert iteration_us is not None  # not optional
        ready_raw = raw.get("grad_ready_us", {})
        if not isinstance(ready_raw, dict):
            raise err(f"{p}.grad_ready_us", "must be an object (tensor name -> us)")
        ready: dict[str, float] = {}
        for name, t in ready_raw.items():
            value = num(t, f"{p}.grad_ready_us.{name}")
            assert value is not None
            ready[name] = value
        units_raw = raw.get("units", [])
        if not isinstance(units_raw, list):
            raise err(f"{p}.units", "must be a list of [bytes, duration_us]")
        units: list[tuple[int, float]] = []
        for j, u in enumerate(units_raw):
            up = f"{p}.units[{j}]"
            if not isinstance(u, list) or len(u) != 2:
                raise err(up, "must be a pair [bytes, duration_us]")
            size, dur = u
            size = require_int(size, where=where, field=up, name="bytes", above=0)
            d = num(dur, up)
            assert d is not None
            units.append((size, d))
        its.append(
            IterationStats(
                iteration=index,
                iteration_us=iteration_us,
                backward_us=num(raw.get("backward_us"), f"{p}.backward_us", optional=True),
                forward_us=num(raw.get("forward_us"), f"{p}.forward_us", optional=True),
                grad_ready_us=ready,
                unit_samples=tuple(units),
            )
        )
    return ObservedStats(iterations=tuple(its), trace_digest=digest, meta=meta)


# ---------------------------------------------------------------------------------------------
# What the trace predicts for the same quantities


@dataclass(frozen=True, kw_only=True, slots=True)
class TraceSpans:
    """The trace's ideal-compute (no communication) timeline, in the monitor's terms."""

    backward_us: float
    """From the window start to the last backward op's finish."""
    forward_us: float
    """From the first forward op's start to the last forward op's finish."""
    ready_us: Mapping[str, float]
    """Each tensor's ready time (its producer's finish) from the window start."""


def trace_spans(trace: Trace) -> TraceSpans:
    """Ideal-compute spans of a trace: each op starts when its deps finish (no comm waits);
    the compute-only schedule of ``pace.analysis``."""
    an = analyze(trace)
    bw = [an.ef_us[i] for i, o in enumerate(trace.ops) if o.phase == "backward"]
    fw = [i for i, o in enumerate(trace.ops) if o.phase == "forward"]
    return TraceSpans(
        backward_us=max(bw, default=0.0),
        forward_us=(max(an.ef_us[i] for i in fw) - min(an.es_us[i] for i in fw)) if fw else 0.0,
        ready_us=dict(zip(an.tensor_names, an.release_us, strict=True)),
    )


def warp_backward(trace: Trace, ready_us: Mapping[str, float]) -> Trace:
    """``trace`` with its backward ops stretched so that the gradients become ready when
    ``ready_us`` observed them (per tensor name, from the start of the backward pass).

    A scale per phase (:func:`estimate`) keeps the profile's shape of the backward. That
    shape does not survive a shared machine: beside another rank on the cores, VGG's late
    convolutions (few pixels, 9 MiB of weights each: the gradients a schedule sends first)
    ran 1.24-1.93x their share of the profile, the later gradients 0.99-1.07x
    (benchmarks/bench_netns.py, docs/results.md), so the replay had the largest
    gradients ready tens of milliseconds early. The warp is a monotone piecewise-linear map
    of time, anchored at ``(0, 0)`` and at each observed tensor's (ideal ready time,
    observed time) after an isotonic fit (noisy observations of ties stay monotone); every
    backward op runs from the map of its ideal start to the map of its ideal finish, so on a
    chain each observed gradient is ready exactly when observed. Past the last anchor the
    map keeps the overall ratio. Ops of other phases, tensors and the comm model are
    unchanged. Tensors not observed are ready where the map puts their producer.

    Raises ``InputError`` naming the field for an unknown tensor or a time that is not a
    finite number >= 0.
    """
    import numpy as np
    from scipy.optimize import isotonic_regression

    an = analyze(trace)
    ideal = dict(zip(an.tensor_names, an.release_us, strict=True))
    points: dict[float, list[float]] = {}
    for name, t in ready_us.items():
        if name not in ideal:
            raise InputError(f"no tensor {name!r} in the trace", field=f"ready_us[{name!r}]")
        got = require_number(t, field=f"ready_us[{name!r}]", minimum=0)
        points.setdefault(ideal[name], []).append(got)
    xs = sorted(x for x in points if x > 0)
    if not xs:
        return trace
    # One anchor per ideal time (ties: their mean), then the monotone fit weighted by how
    # many observations each anchor holds.
    weights = [len(points[x]) for x in xs]
    means = [statistics.fmean(points[x]) for x in xs]
    ys = isotonic_regression(means, weights=weights).x
    x_anchor = np.array([0.0, *xs])
    y_anchor = np.array([0.0, *ys])
    tail = y_anchor[-1] / x_anchor[-1]

    def warp(t: float) -> float:
        if t <= x_anchor[-1]:
            return float(np.interp(t, x_anchor, y_anchor))
        return float(y_anchor[-1] + (t - x_anchor[-1]) * tail)

    ops = tuple(
        dataclasses.replace(op, duration_us=max(0.0, warp(an.ef_us[i]) - warp(an.es_us[i])))
        if op.phase == "backward"
        else op
        for i, op in enumerate(trace.ops)
    )
    return dataclasses.replace(trace, ops=ops)


@dataclass(frozen=True, kw_only=True, slots=True)
class ReplayedSpans:
    """What the replay of the running schedule predicts the monitor sees: its spans, and how
    much slower than the idle link's cost it runs each size of unit."""

    spans: TraceSpans
    unit_charge: Mapping[int, tuple[float, float]]
    """Per unit size in bytes: ``(k, extra_us)`` with the replay's median duration of that
    size ``(1 + k) * cost + extra_us``: the interference term as the replay charged it,
    ``extra_us`` the median per-call delay (added to units issued while an op runs), ``k`` the
    stretch of the units' share beside compute."""

    def alone_us(self, size_bytes: int, observed_us: float) -> float | None:
        """``observed_us`` taken back to the idle link's cost as the replay charged this size
        (``None``: the running schedule has no unit of that size)."""
        charge = self.unit_charge.get(size_bytes)
        if charge is None:
            return None
        k, extra_us = charge
        return max(0.0, (observed_us - extra_us) / (1.0 + k))


def replayed_spans(trace: Trace, schedule: Schedule) -> ReplayedSpans:
    """The monitor's quantities as the replay of ``schedule`` on ``trace`` predicts them.

    With an interference term, compute beside communication runs slower and units beside
    compute take longer; the monitor observes both. An estimate against the ideal spans of
    :func:`trace_spans` would put that slowdown into the per-phase scales and the link, and the
    replay of the re-estimated trace would charge it again. The forward span is the time any
    forward op runs (the monitor subtracts the forward's waits on communication). The replay is
    the runtime's, strictly in priority order: on drifted timings a unit may be ready before
    one with a smaller priority, and the runtime (which the monitor watches) waits for that one.
    """
    from pace.sim import covered_us, merge_intervals, schedule_policy, simulate

    res = simulate(trace, schedule_policy(schedule, in_order=True))
    start, finish = res.op_start_us, res.op_finish_us
    an = analyze(trace)
    phases = [o.phase for o in trace.ops]
    bw = [finish[i] for i, p in enumerate(phases) if p == "backward"]
    fw = [(start[i], finish[i]) for i, p in enumerate(phases) if p == "forward"]
    ready: dict[str, float] = {}
    for i, made in enumerate(an.produces):
        for k in made:
            ready[an.tensor_names[k]] = finish[i]
    busy = merge_intervals(zip(start, finish, strict=True))
    busy_starts = [s for s, _ in busy]
    term = trace.comm.interference
    per_call_us = term.comm_us_per_call if term is not None else 0.0
    by_size: dict[int, list[tuple[float, float]]] = {}
    for unit, t0, t1 in zip(res.units, res.unit_start_us, res.unit_finish_us, strict=True):
        j = bisect.bisect_right(busy_starts, t0) - 1
        # The replay adds the per-call delay to a unit issued while an op runs (drive_joint).
        extra = per_call_us if j >= 0 and t0 < busy[j][1] else 0.0
        by_size.setdefault(sum(s.size_bytes for s in unit.slices), []).append((t1 - t0, extra))
    charge: dict[int, tuple[float, float]] = {}
    for size, got in by_size.items():
        cost = trace.comm.cost_us(size)
        if cost <= 0:
            continue
        # Both at the median, which is what the fit takes per size: the charge then maps the
        # replay's median duration exactly onto the cost, and an affine map commutes with it.
        dur = statistics.median(d for d, _ in got)
        extra = statistics.median(e for _, e in got)
        if dur - extra <= 0:
            extra = 0.0
        charge[size] = ((dur - extra) / cost - 1.0, extra)
    return ReplayedSpans(
        spans=TraceSpans(
            backward_us=max(bw, default=0.0),
            forward_us=covered_us(fw),
            ready_us=ready,
        ),
        unit_charge=charge,
    )


# ---------------------------------------------------------------------------------------------
# The estimate


@dataclass(frozen=True, kw_only=True, slots=True)
class EstimateOptions:
    """How observations are reduced to an estimate."""

    window: int = 20
    """Most recent iterations the medians are taken over."""
    ewma_weight: float = 1.0
    """Weight of a new window median in ``Estimator``'s running estimate; 1.0 = no EWMA.

    The default keeps successive estimates independent: after a step change the new regime should
    be adopted at once, which an EWMA would delay by mixing in the old one.
    """
    min_unit_samples: int = 2
    """Fewer observed units than this keep the trace's comm model unchanged."""

    def __post_init__(self) -> None:
        if self.window < 1:
            raise InputError(f"must be >= 1, got {self.window!r}", field="window")
        if not (0.0 < self.ewma_weight <= 1.0):
            raise InputError(f"must be in (0, 1], got {self.ewma_weight!r}", field="ewma_weight")
        if self.min_unit_samples < 1:
            raise InputError(
                f"must be >= 1, got {self.min_unit_samples!r}", field="min_unit_samples"
            )


@dataclass(frozen=True, kw_only=True, slots=True)
class Estimate:
    """Smoothed drift estimate relative to a trace."""

    forward_scale: float
    """Observed forward compute / the trace's forward span (1.0 if not observed)."""
    backward_scale: float
    """Observed backward compute / the trace's backward span (1.0 if not observed)."""
    alpha_us: float
    beta_us_per_byte: float
    observed_iteration_us: float
    """Median observed iteration time over the window."""
    iterations_used: int
    comm_points: tuple[tuple[int, float], ...] = ()
    """The ``(bytes, median duration_us)`` points the comm model was fitted on."""

    def summary(self) -> dict[str, float | int]:
        """The scalar fields (not ``comm_points``): ``meta.drift_estimate`` and CLI output."""
        return {
            "forward_scale": self.forward_scale,
            "backward_scale": self.backward_scale,
            "alpha_us": self.alpha_us,
            "beta_us_per_byte": self.beta_us_per_byte,
            "observed_iteration_us": self.observed_iteration_us,
            "iterations_used": self.iterations_used,
        }


def estimate(
    trace: Trace,
    stats: ObservedStats,
    options: EstimateOptions | None = None,
    *,
    running: Schedule | None = None,
) -> Estimate:
    """Median-over-window estimate of the drift of ``stats`` relative to ``trace``.

    ``running``: the schedule the observed iterations ran. With an interference term in the
    trace, the observations are compared with that schedule's replay (:func:`replayed_spans`),
    which already charges the term, instead of the ideal spans; otherwise the slowdown the term
    models would be estimated as drift and then charged a second time.

    Raises ``InputError`` if ``stats`` holds no iteration.
    """
    opts = options if options is not None else EstimateOptions()
    its = stats.iterations[-opts.window :]
    if not its:
        raise InputError("no observed iteration to estimate from", field="iterations")
    term = trace.comm.interference
    replayed = (
        replayed_spans(trace, running)
        if running is not None and term is not None and term.active
        else None
    )
    spans = replayed.spans if replayed is not None else trace_spans(trace)

    bw_ratios: list[float] = []
    fw_ratios: list[float] = []
    for it in its:
        if it.backward_us is not None and spans.backward_us > 0:
            bw_ratios.append(it.backward_us / spans.backward_us)
        elif it.grad_ready_us:
            # No span measured: the ready times of gradients are producer finishes, so their
            # ratio to the trace's ready times is the backward scale (median over tensors).
            per_tensor = [
                t / spans.ready_us[name]
                for name, t in it.grad_ready_us.items()
                if spans.ready_us.get(name, 0.0) > 0
            ]
            if per_tensor:
                bw_ratios.append(statistics.median(per_tensor))
        if it.forward_us is not None and spans.forward_us > 0:
            fw_ratios.append(it.forward_us / spans.forward_us)

    alpha, beta, points = _fit_comm(
        trace.comm, (s for it in its for s in it.unit_samples), opts.min_unit_samples, replayed
    )
    return Estimate(
        forward_scale=statistics.median(fw_ratios) if fw_ratios else 1.0,
        backward_scale=statistics.median(bw_ratios) if bw_ratios else 1.0,
        alpha_us=alpha,
        beta_us_per_byte=beta,
        observed_iteration_us=statistics.median(it.iteration_us for it in its),
        iterations_used=len(its),
        comm_points=points,
    )


def _fit_comm(
    comm: CommModel,
    samples: Iterable[tuple[int, float]],
    min_samples: int,
    replayed: ReplayedSpans | None = None,
) -> tuple[float, float, tuple[tuple[int, float], ...]]:
    """(alpha, beta) from unit samples: median duration per size, then a linear fit.

    Medians per distinct size first, so one slow call does not tilt the line. With an
    interference term, each duration is first taken back to the idle link's cost: as the
    replay of the running schedule charged a unit of its size (``replayed``), else as if the
    unit ran beside compute all along (most do in a training loop; one that did not is
    under-charged by the term). With a single
    distinct size the two parameters are not identifiable: keep the trace's alpha and attribute
    the change to beta (bandwidth drift is the common case; per-call latency rarely moves).
    """
    by_size: dict[int, list[float]] = {}
    n = 0
    for size, dur in samples:
        by_size.setdefault(size, []).append(dur)
        n += 1
    if n < min_samples:
        return comm.alpha_us, comm.beta_us_per_byte, ()
    term = comm.interference

    def alone_us(size: int, dur: float) -> float:
        # The runtime's units run beside compute, where the model charges them
        # ``(1 + comm_stretch) * cost + comm_us_per_call`` (docs/simulator.md). Fitting the raw
        # durations would put that into alpha and beta, and the replay would charge it a second
        # time: re-estimating the model's own prediction came out 6.4% slower.
        alone = replayed.alone_us(size, dur) if replayed is not None else None
        if alone is None:
            alone = dur if term is None else term.alone_us(dur)
        return alone

    # The median of the raw durations first, then taken back: the map is affine but clipped
    # at 0, and a clip does not commute with a median. Mapped one by one, units charged the
    # per-call delay and units that ran alone (clipped to 0) gave a median between the two,
    # not the link's cost (a tiny unit's 26 us beside a 359 us delay: re-estimated 43 us).
    points = tuple(
        sorted((size, alone_us(size, statistics.median(ds))) for size, ds in by_size.items())
    )
    if len(points) == 1:
        size, dur = points[0]
        beta = max(dur - comm.alpha_us, 0.0) / size
        return comm.alpha_us, beta, points
    alpha, beta = fit_alpha_beta(points, workers=comm.workers)
    return alpha, beta, points


def fit_alpha_beta(points: Sequence[tuple[int, float]], *, workers: int) -> tuple[float, float]:
    """``us = alpha + beta * bytes`` through ``pace.cost.fit_linear`` (the profiler's fit).

    That fit weighs relative residuals and keeps both coefficients >= 0, which is what a
    re-estimate needs: small units must not be drowned by large ones, and a negative latency
    from noisy small calls cannot be scheduled with.
    """
    from pace.cost import fit_linear

    model, _quality = fit_linear(list(points), workers=workers, algorithm="ring")
    return model.alpha_us, model.beta_us_per_byte


def phase_scaled_ops(
    trace: Trace, *, forward_scale: float, backward_scale: float
) -> tuple[Op, ...]:
    """``trace.ops`` with forward and backward durations scaled; other phases unchanged."""
    return tuple(
        dataclasses.replace(op, duration_us=op.duration_us * forward_scale)
        if op.phase == "forward"
        else dataclasses.replace(op, duration_us=op.duration_us * backward_scale)
        if op.phase == "backward"
        else op
        for op in trace.ops
    )


def apply_estimate(trace: Trace, est: Estimate) -> Trace:
    """The trace with op durations scaled per phase and the comm model replaced.

    Ops of phase ``optimizer``/``other`` keep their durations: the monitor does not observe them.
    """
    ops = phase_scaled_ops(
        trace, forward_scale=est.forward_scale, backward_scale=est.backward_scale
    )
    comm = dataclasses.replace(
        trace.comm,
        alpha_us=est.alpha_us,
        beta_us_per_byte=est.beta_us_per_byte,
        samples=tuple((b, d) for b, d in est.comm_points),
    )
    meta = dict(trace.meta)
    meta["drift_estimate"] = est.summary()
    return dataclasses.replace(trace, ops=ops, comm=comm, meta=meta)


def reestimate(
    trace: Trace,
    stats: ObservedStats,
    options: EstimateOptions | None = None,
    *,
    running: Schedule | None = None,
) -> Trace:
    """``apply_estimate(trace, estimate(trace, stats, options, running=running))``."""
    return apply_estimate(trace, estimate(trace, stats, options, running=running))


class Estimator:
    """Running estimate over successive windows, optionally EWMA-smoothed.

    ``update`` is called at re-estimation time (rare), not per iteration, so it may be O(window).
    """

    def __init__(self, trace: Trace, options: EstimateOptions | None = None) -> None:
        self.trace = trace
        self.options = options if options is not None else EstimateOptions()
        self.current: Estimate | None = None

    def update(self, stats: ObservedStats) -> Estimate:
        new = estimate(self.trace, stats, self.options)
        w = self.options.ewma_weight
        if self.current is None or w >= 1.0:
            self.current = new
        else:
            old = self.current

            def mix(a: float, b: float) -> float:
                return w * b + (1.0 - w) * a

            self.current = dataclasses.replace(
                new,
                forward_scale=mix(old.forward_scale, new.forward_scale),
                backward_scale=mix(old.backward_scale, new.backward_scale),
                alpha_us=mix(old.alpha_us, new.alpha_us),
                beta_us_per_byte=mix(old.beta_us_per_byte, new.beta_us_per_byte),
                observed_iteration_us=mix(old.observed_iteration_us, new.observed_iteration_us),
            )
        return self.current

    def trace_estimate(self) -> Trace:
        """The base trace with the current estimate applied (the base trace if none yet)."""
        if self.current is None:
            return self.trace
        return apply_estimate(self.trace, self.current)
