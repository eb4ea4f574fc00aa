"""Baseline policies: models of the systems pace is compared against, with their real defaults.

Every default and its source is written down in ``docs/baselines.md``. Orders used below:

* *ready order*: tensors by ready time (producer finish in the compute-only schedule), ties in
  trace order; the order in which WFBP enqueues gradients.
* *layer order*: tensors by the compute-only start of their earliest consumer in the next forward
  pass, ties in trace order; "closer to the input layer first" (P3, ByteScheduler), and exactly
  TicTac's "when the next forward needs it".
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from typing import Any

from pace.analysis import TraceAnalysis
from pace.errors import InputError, LimitError
from pace.ir import Schedule, Slice, Trace, Unit
from pace.sim import tuning
from pace.sim.core import (
    CycleFusion,
    Decision,
    Policy,
    SimOptions,
    SimResult,
    as_policy,
    replay_policy,
    schedule_policy,
)

MIB = 1024 * 1024
KIB = 1024
# Bytes per parameter when a default is stated in parameters (fp32 gradients).
BYTES_PER_PARAM = 4

HOROVOD_FUSION_THRESHOLD_BYTES = 128 * MIB
HOROVOD_CYCLE_TIME_US = 1000.0
HOROVOD_OLD_FUSION_THRESHOLD_BYTES = 64 * MIB
HOROVOD_OLD_CYCLE_TIME_US = 5000.0
DDP_BUCKET_CAP_BYTES = 25 * MIB
DDP_FIRST_BUCKET_BYTES = 1 * MIB
P3_SLICE_BYTES = 160 * KIB
# ByteScheduler's documented values for all-reduce (BYTESCHEDULER_PARTITION /
# BYTESCHEDULER_CREDIT, in parameters).
BYTESCHEDULER_PARTITION_BYTES = 8_000_000 * BYTES_PER_PARAM
BYTESCHEDULER_CREDIT_BYTES = 16_000_000 * BYTES_PER_PARAM
# Grid of bytescheduler-tuned (credits in units in flight).
# 64 KiB .. 64 MiB in powers of two, plus ByteScheduler's own default so tuned <= default.
TUNE_PARTITION_BYTES: tuple[int, ...] = tuple(
    sorted({2**e * KIB for e in range(6, 17)} | {BYTESCHEDULER_PARTITION_BYTES})
)
TUNE_CREDITS: tuple[int, ...] = (1, 2, 3, 4, 6, 8)
# Work limits (docs/simulator.md, "Work limits"): a replay costs about 8 us per unit, so
# P3's 160 KiB slices of a large trace are the one place where valid input could take minutes
# (256 TiB, the largest trace allowed, is 1.7e9 slices). Above MAX_PARTITION_UNITS a
# partitioning policy is refused with LimitError (pace compare and compile leave it out with a
# warning); a bytescheduler-tuned grid point above TUNE_MAX_UNITS is skipped, since the grid
# replays each point once per credit.
MAX_PARTITION_UNITS = 2**20
TUNE_MAX_UNITS = 2**16

_BARRIER = SimOptions(barrier=True)


def ready_order(prep: TraceAnalysis) -> tuple[int, ...]:
    """Tensor indices in ready order."""
    return prep.ready_order


def layer_order(prep: TraceAnalysis) -> tuple[int, ...]:
    """Tensor indices in layer order (earliest forward consumer first; none: last)."""
    need = prep.need_us
    return tuple(sorted(range(len(need)), key=lambda k: (need[k], k)))


def _whole(prep: TraceAnalysis, k: int) -> Slice:
    return Slice(tensor=prep.tensor_names[k], offset_bytes=0, size_bytes=prep.size_bytes[k])


def _one_unit_per_tensor(prep: TraceAnalysis, order: Iterable[int]) -> tuple[Unit, ...]:
    return tuple(
        Unit(priority=float(rank), slices=(_whole(prep, k),)) for rank, k in enumerate(order)
    )


def partition_units(
    prep: TraceAnalysis, order: Iterable[int], partition_bytes: int
) -> tuple[Unit, ...]:
    """Cut every tensor into ``partition_bytes`` slices (the last one shorter); every slice of
    a tensor gets the tensor's rank in ``order`` as priority, listed by offset so that file order
    breaks the tie front to back.
    """
    if partition_bytes < 1:
        raise InputError(f"must be >= 1, got {partition_bytes}", field="partition_bytes")
    count = partition_count(prep, partition_bytes)
    if count > MAX_PARTITION_UNITS:
        raise LimitError(
            f"cutting the trace's {sum(prep.size_bytes)} bytes into {partition_bytes}-byte "
            f"partitions gives {count} units, more than the {MAX_PARTITION_UNITS} a replay "
            "may have (docs/simulator.md, 'Work limits')"
        )
    names = prep.tensor_names
    sizes = prep.size_bytes
    units: list[Unit] = []
    append = units.append
    make_slice, make_unit = _unit_makers()
    for rank, k in enumerate(order):
        size = sizes[k]
        name = names[k]
        prio = float(rank)
        for off in range(0, size, partition_bytes):
            part = size - off if size - off < partition_bytes else partition_bytes
            append(make_unit(prio, (make_slice(name, off, part),)))
    return tuple(units)


def _unit_makers() -> tuple[
    Callable[[str, int, int], Slice], Callable[[float, tuple[Slice, ...]], Unit]
]:
    """Constructors of single-slice partition units, a few times faster than the dataclass
    ``__init__`` (fields set directly; ``Slice`` and ``Unit`` check nothing at construction). If
    either type ever gains a ``__post_init__``, the ordinary constructors are used.
    """
    if hasattr(Slice, "__post_init__") or hasattr(Unit, "__post_init__"):
        return (
            lambda t, o, n: Slice(tensor=t, offset_bytes=o, size_bytes=n),
            lambda p, sl: Unit(priority=p, slices=sl),
        )
    new = object.__new__
    # The slots' member descriptors write a field as the frozen __init__ does.
    set_tensor = Slice.__dict__["tensor"].__set__
    set_offset = Slice.__dict__["offset_bytes"].__set__
    set_size = Slice.__dict__["size_bytes"].__set__
    set_priority = Unit.__dict__["priority"].__set__
    set_slices = Unit.__dict__["slices"].__set__

    def make_slice(t: str, o: int, n: int) -> Slice:
        s = new(Slice)
        set_tensor(s, t)
        set_offset(s, o)
        set_size(s, n)
        return s

    def make_unit(p: float, sl: tuple[Slice, ...]) -> Unit:
        u = new(Unit)
        set_priority(u, p)
        set_slices(u, sl)
        return u

    return make_slice, make_unit


def partition_count(prep: TraceAnalysis, partition_bytes: int) -> int:
    """Units ``partition_units`` would make: ceil(size / partition) summed over tensors."""
    return sum(-(-size // partition_bytes) for size in prep.size_bytes)


def fifo() -> Policy:
    """WFBP: each gradient all-reduced alone as soon as it is ready, in ready order; barrier."""

    def build(prep: TraceAnalysis, options: SimOptions) -> Decision:
        return Decision(units=_one_unit_per_tensor(prep, prep.ready_order), defaults=_BARRIER)

    return Policy(name="fifo", build=build, description="WFBP: one unit per tensor, ready order")


def horovod(
    *,
    threshold_bytes: int = HOROVOD_FUSION_THRESHOLD_BYTES,
    cycle_us: float = HOROVOD_CYCLE_TIME_US,
    synchronous: bool = True,
    name: str = "horovod",
) -> Policy:
    """Horovod tensor fusion: every cycle, fuse all ready tensors up to the threshold; barrier.

    ``synchronous``: the background thread waits for its collectives before the next cycle
    (CPU/Gloo builds; the default, matching this project's runtime); ``False`` models GPU/NCCL
    builds where collectives are only enqueued on a stream.
    """
    if threshold_bytes < 0:
        raise InputError(f"must be >= 0, got {threshold_bytes}", field="threshold_bytes")
    if not (math.isfinite(cycle_us) and cycle_us >= 0):
        raise InputError(f"must be finite and >= 0, got {cycle_us}", field="cycle_us")
    fusion = CycleFusion(
        threshold_bytes=threshold_bytes, cycle_us=cycle_us, synchronous=synchronous
    )

    def build(prep: TraceAnalysis, options: SimOptions) -> Decision:
        return Decision(
            cycle_fusion=fusion,
            defaults=_BARRIER,
            knobs={
                "fusion_threshold_bytes": threshold_bytes,
                "cycle_time_us": cycle_us,
                "synchronous": synchronous,
            },
        )

    return Policy(name=name, build=build, description="Horovod cycle-time tensor fusion")


def horovod_old() -> Policy:
    """Horovod with its older defaults (64 MB fusion buffer, 5 ms cycle)."""
    return horovod(
        threshold_bytes=HOROVOD_OLD_FUSION_THRESHOLD_BYTES,
        cycle_us=HOROVOD_OLD_CYCLE_TIME_US,
        name="horovod-old",
    )


def ddp_buckets(
    prep: TraceAnalysis, order: Iterable[int], *, cap_bytes: int, first_bytes: int
) -> list[list[int]]:
    """PyTorch DDP's bucket assignment (the reducer's ``compute_bucket_assignment_by_size``):
    walk tensors in ``order``, each into the open bucket of its dtype (``Tensor.fusion_kind``;
    a bucket holds one dtype), and close that bucket once its size reaches its limit (so a bucket
    may exceed it by its last tensor); each dtype's first bucket's limit is ``first_bytes``,
    every later one ``cap_bytes``. Buckets in the order they closed, then the ones left open in
    the order of their first tensor. With one dtype: runs of ``order``.
    """
    walk = list(order)
    position = {k: i for i, k in enumerate(walk)}
    buckets: list[list[int]] = []
    open_: dict[tuple[int, str], tuple[list[int], int]] = {}  # kind -> (tensors, bytes)
    limits: dict[tuple[int, str], int] = {}
    for k in walk:
        key = prep.fusion_kind[k]
        current, size = open_.pop(key, ([], 0))
        current.append(k)
        size += prep.size_bytes[k]
        limit = limits.setdefault(key, first_bytes)
        if size >= limit:
            buckets.append(current)
            limits[key] = cap_bytes
        else:
            open_[key] = (current, size)
    buckets.extend(sorted((b for b, _ in open_.values()), key=lambda b: position[b[0]]))
    return buckets


def ddp(
    *,
    bucket_cap_bytes: int = DDP_BUCKET_CAP_BYTES,
    first_bucket_bytes: int = DDP_FIRST_BUCKET_BYTES,
) -> Policy:
    """PyTorch DDP: gradient buckets, each all-reduced when all its grads are ready, strictly in
    bucket order; the optimizer step (and so the next forward) waits for all of them (barrier).

    Bucket order: DDP first buckets parameters in reverse registration order, then after the
    first iteration rebuilds the buckets in the order gradients actually became ready; the steady
    state modelled here is that rebuilt order, i.e. ready order.
    """
    if bucket_cap_bytes < 1 or first_bucket_bytes < 1:
        raise InputError("bucket sizes must be >= 1 byte", field="bucket_cap_bytes")

    def build(prep: TraceAnalysis, options: SimOptions) -> Decision:
        buckets = ddp_buckets(
            prep, prep.ready_order, cap_bytes=bucket_cap_bytes, first_bytes=first_bucket_bytes
        )
        units = tuple(
            Unit(priority=float(b), slices=tuple(_whole(prep, k) for k in bucket))
            for b, bucket in enumerate(buckets)
        )
        return Decision(
            units=units,
            defaults=_BARRIER,
            in_order=True,
            knobs={
                "bucket_cap_bytes": bucket_cap_bytes,
                "first_bucket_bytes": first_bucket_bytes,
                "buckets": len(buckets),
            },
        )

    return Policy(name="ddp", build=build, description="PyTorch DDP gradient buckets")


def tictac() -> Policy:
    """TicTac: whole tensors, ordered by when the next forward pass needs them; no barrier."""

    def build(prep: TraceAnalysis, options: SimOptions) -> Decision:
        return Decision(units=_one_unit_per_tensor(prep, layer_order(prep)))

    return Policy(name="tictac", build=build, description="order by forward need, no partition")


def p3(*, slice_bytes: int = P3_SLICE_BYTES) -> Policy:
    """P3: 160 KB slices, priority by layer, one slice in flight (stop-and-wait); no barrier."""

    def build(prep: TraceAnalysis, options: SimOptions) -> Decision:
        return Decision(
            units=partition_units(prep, layer_order(prep), slice_bytes),
            defaults=SimOptions(credit=1),
            knobs={"slice_bytes": slice_bytes},
        )

    return Policy(name="p3", build=build, description="160 KB slices, layer priority")


def bytescheduler(
    *,
    partition_bytes: int = BYTESCHEDULER_PARTITION_BYTES,
    credit_bytes: int = BYTESCHEDULER_CREDIT_BYTES,
    window: str = "units",
    name: str = "bytescheduler",
) -> Policy:
    """ByteScheduler: partition, priority by layer, credit; no barrier.

    ByteScheduler's core starts the highest-priority ready piece whenever its credit is
    positive and subtracts the piece's size (returned when the piece finishes). ``window``:
    ``"units"`` (default) models that window as ``credit_bytes // partition_bytes`` units in
    flight, exact when the pieces are full-size; ``"bytes"`` models the byte window itself
    (``SimOptions.credit_bytes``), which also lets many small pieces in at once.
    """
    if partition_bytes < 1 or credit_bytes < 1:
        raise InputError("partition and credit must be >= 1 byte", field="partition_bytes")
    if window not in ("units", "bytes"):
        raise InputError(f"must be 'units' or 'bytes', got {window!r}", field="window")
    credit_units = max(1, credit_bytes // partition_bytes)
    defaults = (
        SimOptions(credit=credit_units)
        if window == "units"
        else SimOptions(credit_bytes=credit_bytes)
    )

    def build(prep: TraceAnalysis, options: SimOptions) -> Decision:
        return Decision(
            units=partition_units(prep, layer_order(prep), partition_bytes),
            defaults=defaults,
            knobs={
                "partition_bytes": partition_bytes,
                "credit_bytes": credit_bytes,
                "credit_units": credit_units,
                "window": window,
            },
        )

    return Policy(name=name, build=build, description="partition + credit + layer priority")


def bytescheduler_tuned(
    *,
    partitions_bytes: tuple[int, ...] = TUNE_PARTITION_BYTES,
    credits: tuple[int, ...] = TUNE_CREDITS,
) -> Policy:
    """ByteScheduler with the best (partition, credit) of a grid, found by simulation.

    ByteScheduler tunes these two knobs online with Bayesian optimisation; an exhaustive grid in
    the simulator is at least as good as what BO could find on that grid. Credits are in units
    in flight (as ``bytescheduler``'s default window model). The caller's explicit ``credit``
    option, if any, pins the credit.
    """

    def build(prep: TraceAnalysis, options: SimOptions) -> Decision:
        order = layer_order(prep)
        grid_credits = (options.credit,) if options.credit is not None else credits
        parts = [p for p in partitions_bytes if partition_count(prep, p) <= TUNE_MAX_UNITS]
        if not parts:
            raise LimitError(
                f"every grid partition cuts the trace's {sum(prep.size_bytes)} bytes into more "
                f"than {TUNE_MAX_UNITS} units (docs/simulator.md, 'Work limits')"
            )
        if (
            options.one_compute_stream
            or options.agreed_readiness
            or options.queued
            or not tuning.fast_path_ok(prep, parts)
        ):
            best = _grid_by_replay(prep, options, order, parts, grid_credits)
        else:
            best = _grid_fast(prep, options, order, parts, grid_credits)
        credit_best = best[2]
        return Decision(
            units=partition_units(prep, order, -best[3]),
            defaults=SimOptions(credit=credit_best),
            knobs={
                "partition_bytes": -best[3],
                "credit_units": credit_best,
                "grid_points": len(partitions_bytes) * len(grid_credits),
            },
        )

    return Policy(
        name="bytescheduler-tuned", build=build, description="grid search partition x credit"
    )


# A grid point's key: (iteration_us, comm_busy_us, credit, -partition_bytes). Ties (common when
# compute dominates) go to the least channel time, then the smaller credit and the larger
# partition: fewer calls, less overhead.
_Key = tuple[float, float, int, int]


def _grid_by_replay(
    prep: TraceAnalysis,
    options: SimOptions,
    order: tuple[int, ...],
    parts: list[int],
    grid_credits: tuple[int, ...],
) -> _Key:
    """The smallest key of the grid, replaying every point with :func:`simulate`."""
    best: _Key | None = None
    for part in parts:
        units = partition_units(prep, order, part)
        pol = Policy(name="_grid", build=_fixed(units))
        for credit in grid_credits:
            res = replay_policy(prep.trace, pol, options=options.over(SimOptions(credit=credit)))
            key = (res.iteration_us, res.comm_busy_us, credit, -part)
            if best is None or key < best:
                best = key
    assert best is not None
    return best


def _grid_fast(
    prep: TraceAnalysis,
    options: SimOptions,
    order: tuple[int, ...],
    parts: list[int],
    grid_credits: tuple[int, ...],
) -> _Key:
    """The same key as :func:`_grid_by_replay` (pace.sim.tuning): tensor-level replays of the
    points, partitions visited by ascending lower bound and skipped once it exceeds the best
    iteration found.
    """
    barrier = bool(options.barrier)
    bounds = tuning.partition_lower_bounds(prep, parts, barrier)
    best: _Key | None = None
    for bound, part in sorted(zip(bounds, parts, strict=True)):
        if best is not None and bound > best[0] + tuning.PRUNE_REL_MARGIN * max(1.0, abs(best[0])):
            break
        p = tuning.make_partition(prep, order, part)
        for credit in grid_credits:
            if credit == 1:
                times = tuning.serial_partition_replay(p)
            else:
                times = tuning.shared_partition_replay(p, credit, options.credit_bytes)
            key = (tuning.iteration_of(prep, p, times, barrier), times.busy_us, credit, -part)
            if best is None or key < best:
                best = key
    assert best is not None
    return best


def _fixed(units: tuple[Unit, ...]) -> Callable[[TraceAnalysis, SimOptions], Decision]:
    def build(prep: TraceAnalysis, options: SimOptions) -> Decision:
        return Decision(units=units)

    return build


POLICIES: dict[str, Callable[..., Policy]] = {
    "fifo": fifo,
    "horovod": horovod,
    "horovod-old": horovod_old,
    "ddp": ddp,
    "tictac": tictac,
    "p3": p3,
    "bytescheduler": bytescheduler,
    "bytescheduler-tuned": bytescheduler_tuned,
}


def compare(
    trace: Any,
    *,
    options: SimOptions | None = None,
    policies: Iterable[str] | None = None,
    skipped: dict[str, str] | None = None,
) -> dict[str, SimResult]:
    """Replay every registered baseline (or ``policies``) on ``trace``.

    ``options`` (if given) override every policy's defaults; otherwise each runs with its own.
    A policy over a work limit (``LimitError``) raises, or with ``skipped`` is left out and
    recorded there (name -> reason).
    """
    opts = options if options is not None else SimOptions()
    names = list(policies) if policies is not None else list(POLICIES)
    out: dict[str, SimResult] = {}
    for name in names:
        factory = POLICIES.get(name)
        if factory is None:
            raise InputError(f"unknown policy {name!r}", field="policy")
        try:
            out[name] = replay_policy(trace, factory(), options=opts)
        except LimitError as exc:
            if skipped is None:
                raise
            skipped[name] = exc.detail
    return out


_CONTRACT = SimOptions()  # every option unset: each policy's defaults, else the contract's


def resolve_policy(policy: Policy | Schedule | str) -> Policy:
    """A :class:`Policy` from a policy, a compiled schedule, or a registered baseline's name."""
    if isinstance(policy, str):
        factory = POLICIES.get(policy)
        if factory is None:
            raise InputError(
                f"unknown policy {policy!r}; known: {', '.join(sorted(POLICIES))}",
                field="policy",
            )
        return factory()
    return as_policy(policy)


def simulate(
    trace: Trace,
    policy: Policy | Schedule | str,
    *,
    options: SimOptions = _CONTRACT,
) -> SimResult:
    """Replay ``policy`` (a policy, a compiled schedule, or a baseline's name) on ``trace``:
    the iteration time and the timeline (``pace.sim.core.replay_policy``)."""
    return replay_policy(trace, resolve_policy(policy), options=options)


def runtime_replay_us(trace: Trace, schedule: Schedule) -> float:
    """``schedule`` replayed on ``trace`` as the runtime issues it, strictly in priority order
    (``schedule_policy(..., in_order=True)``): what a run on those timings takes, where they
    are not the ones the schedule was numbered on (docs/schedule-format.md, "Priorities as the
    runtime reads them")."""
    return float(simulate(trace, schedule_policy(schedule, in_order=True)).iteration_us)
