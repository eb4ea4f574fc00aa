"""The simulator's engine: :func:`replay_policy`, its options, its result and policies.

The public entry, ``pace.sim.simulate``, also resolves a registered baseline's name
(``pace.sim.policies``, which builds on this module; this module imports none of it).

Default mode = the replay semantics of docs/schedule-format.md (the meaning of a schedule's
``predicted_iteration_us``): one channel that starts the ready unit with the smallest priority
(ties in file order) whenever it is free; a unit is ready when every tensor it carries has been
produced and costs ``alpha_us + beta_us_per_byte * bytes``; a tensor is done when all its slices
are; each op starts when its deps and consumed tensors are done, with unlimited parallel ops.

Example (docs/design.md's worked example, tests/data/tiny.trace.json: FIFO finishes at 44 us):

>>> from pace.ir import CommModel, Op, Tensor, Trace
>>> trace = Trace(
...     model="tiny",
...     ops=(
...         Op(name="bw2", phase="backward", duration_us=10),
...         Op(name="bw1", phase="backward", duration_us=10, deps=("bw2",)),
...         Op(name="fw1", phase="forward", duration_us=5, deps=("bw1",)),
...         Op(name="fw2", phase="forward", duration_us=5, deps=("fw1",)),
...     ),
...     tensors=(
...         Tensor(name="w2", size_bytes=20, producer="bw2", consumers=("fw2",)),
...         Tensor(name="w1", size_bytes=4, producer="bw1", consumers=("fw1",)),
...     ),
...     comm=CommModel(workers=2, alpha_us=0.0, beta_us_per_byte=1.0),
... )
>>> from pace.sim.policies import fifo
>>> replay_policy(trace, fifo()).iteration_us
44.0
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from pace.analysis import TraceAnalysis, analyze
from pace.checks import require_int
from pace.errors import InputError
from pace.ir import Schedule, Trace, Unit
from pace.replay import (
    index_units,
    serial_replay,
    tensor_done_us,
    unit_copies,
    updated_us,
    window_us,
)
from pace.sim import channels, drivers


@dataclass(frozen=True, kw_only=True, slots=True)
class SimOptions:
    """Simulator modes beyond the contract's default replay.

    ``None`` means "the policy's default, else the contract's": credit 1, no barrier,
    unlimited parallel compute. An explicit value always wins over the policy's default.

    * ``credit``: units in flight at once, sharing the bandwidth equally (processor sharing).
    * ``credit_bytes``: a byte window on top (ByteScheduler's credit): another unit may start
      only while the bytes in flight are below it; the unit that crosses it still starts. With
      ``credit_bytes`` set and ``credit`` unset, the unit count is unlimited.
    * ``barrier``: the next iteration's forward ops wait for ALL communication to finish, as
      Horovod's ``synchronize()`` before ``optimizer.step()`` and DDP's backward do.
    * ``one_compute_stream``: ops run one at a time on one stream; a free stream starts the
      ready op that became ready earliest, ties in trace order.
    * ``agreed_readiness``: a unit may go only once its gradients are known ready on every
      rank, as in pace's online runtime: each call carries which gradients were ready when it
      was issued, and that becomes known when it completes; when nothing known is left and no
      call is in flight, the ranks run a readiness probe (a call of one 4-byte flag per
      gradient). Default: a gradient is known the moment it is produced.
    * ``queued``: the units in flight cross the channel one at a time, in issue order, instead
      of sharing its bandwidth (an in-order backend: Horovod without fusion, NCCL, pace's
      one-thread gloo group); ``credit``/``credit_bytes`` then bound how far ahead units are
      committed to the queue.
    """

    credit: int | None = None
    barrier: bool | None = None
    one_compute_stream: bool | None = None
    credit_bytes: int | None = None
    agreed_readiness: bool | None = None
    queued: bool | None = None

    def __post_init__(self) -> None:
        for name in ("credit", "credit_bytes"):
            v = getattr(self, name)
            if v is not None:
                require_int(v, field=name, minimum=1)
        for name in ("barrier", "one_compute_stream", "agreed_readiness", "queued"):
            v = getattr(self, name)
            if v is not None and not isinstance(v, bool):
                raise InputError(f"must be true or false, got {v!r}", field=name)

    def over(self, defaults: SimOptions) -> SimOptions:
        """These options, with unset fields taken from ``defaults``."""
        return SimOptions(
            credit=self.credit if self.credit is not None else defaults.credit,
            barrier=self.barrier if self.barrier is not None else defaults.barrier,
            one_compute_stream=(
                self.one_compute_stream
                if self.one_compute_stream is not None
                else defaults.one_compute_stream
            ),
            credit_bytes=(
                self.credit_bytes if self.credit_bytes is not None else defaults.credit_bytes
            ),
            agreed_readiness=(
                self.agreed_readiness
                if self.agreed_readiness is not None
                else defaults.agreed_readiness
            ),
            queued=self.queued if self.queued is not None else defaults.queued,
        )

    def resolved(self) -> SimOptions:
        """Unset fields take the contract's default. ``credit`` stays unset (unlimited units)
        only under a byte window; ``credit_bytes`` stays unset when there is none.
        """
        base = self.over(
            SimOptions(
                barrier=False, one_compute_stream=False, agreed_readiness=False, queued=False
            )
        )
        if base.credit is None and base.credit_bytes is None:
            return base.over(SimOptions(credit=1))
        return base


@dataclass(frozen=True, kw_only=True, slots=True)
class CycleFusion:
    """Horovod's run-time fusion: every ``cycle_us`` fuse ready tensors up to a threshold."""

    threshold_bytes: int
    cycle_us: float
    # The background thread blocks on its collectives (CPU/Gloo) or only enqueues them (NCCL).
    synchronous: bool = True


@dataclass(frozen=True, kw_only=True, slots=True)
class Decision:
    """What a policy decided for one trace: static units, or run-time cycle fusion."""

    units: tuple[Unit, ...] | None = None
    cycle_fusion: CycleFusion | None = None
    defaults: SimOptions = SimOptions()
    knobs: Mapping[str, Any] = field(default_factory=dict)
    # Static units are issued strictly in priority order (a later unit never overtakes).
    in_order: bool = False

    def __post_init__(self) -> None:
        if (self.units is None) == (self.cycle_fusion is None):
            raise InputError(
                "a Decision has exactly one of units and cycle_fusion", field="decision"
            )


@dataclass(frozen=True, kw_only=True, slots=True)
class Policy:
    """A named way to turn a trace into communication: ``build(analysis, options) -> Decision``.

    ``options`` are the caller's explicit options (a tuning policy searches under them).
    """

    name: str
    build: Callable[[TraceAnalysis, SimOptions], Decision]
    description: str = ""


def units_policy(units: Sequence[Unit], *, name: str = "units", in_order: bool = False) -> Policy:
    """Replay exactly ``units`` (priorities as given) under the contract's semantics, or with
    ``in_order`` strictly in priority order (a unit ready before an earlier one waits)."""
    fixed = tuple(units)

    def build(prep: TraceAnalysis, options: SimOptions) -> Decision:
        return Decision(units=fixed, in_order=in_order)

    return Policy(name=name, build=build, description="replay of a fixed unit list")


def schedule_policy(
    schedule: Schedule, *, name: str = "schedule", in_order: bool | None = None
) -> Policy:
    """Replay a compiled pace :class:`~pace.ir.Schedule` (its units, in file order).

    ``in_order``: as the runtime issues them, strictly in priority order, each once its
    gradients are ready (docs/schedule-format.md, "Priorities as the runtime reads them"). A
    schedule numbered in its own replay's start order (``pace.compiler.in_issue_order``)
    replays the same either way on the trace it was compiled for; on other timings (another
    machine's compute, a refitted cost model) the two can differ, and this is the runtime's.
    ``None``: as the schedule says (``Schedule.in_order``, the file's ``in_order``)."""
    if in_order is None:
        in_order = schedule.in_order
    return units_policy(schedule.units, name=name, in_order=in_order)


class _Lazy:
    """Op times and overlap, computed on first access (replays used as an oracle skip them).
    ``tensor_done_us``: when each tensor reaches its consumers (after its update, if any)."""

    __slots__ = ("barrier_gate_us", "cache", "prep", "tensor_done_us")

    def __init__(
        self,
        prep: TraceAnalysis,
        tensor_done_us: Sequence[float],
        barrier_gate_us: float | None,
        cache: dict[str, Any] | None = None,
    ) -> None:
        self.prep = prep
        self.tensor_done_us = tensor_done_us
        self.barrier_gate_us = barrier_gate_us
        self.cache: dict[str, Any] = cache if cache is not None else {}

    def op_times(self) -> tuple[tuple[float, ...], tuple[float, ...]]:
        got: tuple[tuple[float, ...], tuple[float, ...]] | None = self.cache.get("op")
        if got is None:
            s, f = drivers.ideal_op_times(self.prep, self.tensor_done_us, self.barrier_gate_us)
            got = (tuple(s), tuple(f))
            self.cache["op"] = got
        return got


@dataclass(frozen=True, kw_only=True, slots=True)
class SimResult:
    """One replay. Unit fields are aligned with ``units`` (file order, or formation order for a
    policy that forms units at run time); tensor fields with ``trace.tensors``; op fields with
    ``trace.ops``.
    """

    policy: str
    iteration_us: float
    units: tuple[Unit, ...]
    unit_start_us: tuple[float, ...]
    unit_finish_us: tuple[float, ...]
    tensor_done_us: tuple[float, ...]
    comm_busy_us: float
    comm_end_us: float
    options: SimOptions
    knobs: Mapping[str, Any] = field(default_factory=dict, compare=False)
    _lazy: _Lazy | None = field(default=None, compare=False, repr=False)

    @property
    def op_start_us(self) -> tuple[float, ...]:
        return self._need_lazy().op_times()[0]

    @property
    def op_finish_us(self) -> tuple[float, ...]:
        return self._need_lazy().op_times()[1]

    @property
    def overlap_us(self) -> float:
        """Communication time during which at least one op is running."""
        lazy = self._need_lazy()
        got = lazy.cache.get("overlap")
        if got is None:
            starts, finishes = lazy.op_times()
            comp = merge_intervals(zip(starts, finishes, strict=True))
            comm = merge_intervals(zip(self.unit_start_us, self.unit_finish_us, strict=True))
            got = _intersection_length(comm, comp)
            lazy.cache["overlap"] = got
        return float(got)

    def _need_lazy(self) -> _Lazy:
        if self._lazy is None:
            raise InputError("this SimResult carries no op timing", field="op_start_us")
        return self._lazy


def covered_us(intervals: Iterable[tuple[float, float]]) -> float:
    """Length of the union of ``(start, finish)`` intervals (time during which any of them runs)."""
    return float(sum(f - s for s, f in merge_intervals(intervals)))


def merge_intervals(intervals: Iterable[tuple[float, float]]) -> list[tuple[float, float]]:
    """The union of ``(start, finish)`` intervals as disjoint intervals by start; empty ones are
    dropped and intervals that touch are joined."""
    out: list[tuple[float, float]] = []
    for s, f in sorted(intervals):
        if f <= s:
            continue
        if out and s <= out[-1][1]:
            if f > out[-1][1]:
                out[-1] = (out[-1][0], f)
        else:
            out.append((s, f))
    return out


def _intersection_length(a: list[tuple[float, float]], b: list[tuple[float, float]]) -> float:
    i = j = 0
    total = 0.0
    while i < len(a) and j < len(b):
        lo = max(a[i][0], b[j][0])
        hi = min(a[i][1], b[j][1])
        if hi > lo:
            total += hi - lo
        if a[i][1] < b[j][1]:
            i += 1
        else:
            j += 1
    return total


def as_policy(policy: Policy | Schedule) -> Policy:
    """A :class:`Policy` from a policy or a compiled schedule (names: ``pace.sim.simulate``)."""
    if isinstance(policy, Policy):
        return policy
    if isinstance(policy, Schedule):
        return schedule_policy(policy)
    raise TypeError(f"not a policy: {policy!r}")


def replay_policy(
    trace: Trace,
    policy: Policy | Schedule,
    *,
    options: SimOptions = SimOptions(),
) -> SimResult:
    """Replay ``policy`` on ``trace``: the iteration time and the timeline. The public entry,
    which also takes a registered policy's name, is ``pace.sim.simulate``."""
    return _simulate(trace, policy, options=options, force_event_loop=False)


def _simulate(
    trace: Trace,
    policy: Policy | Schedule,
    *,
    options: SimOptions,
    force_event_loop: bool,
) -> SimResult:
    prep = analyze(trace)
    pol = as_policy(policy)
    decision = pol.build(prep, options)
    opts = options.over(decision.defaults).resolved()
    credit = opts.credit
    credit_bytes = opts.credit_bytes
    barrier = bool(opts.barrier)
    serial = bool(opts.one_compute_stream)
    agreed = bool(opts.agreed_readiness)
    queued = bool(opts.queued)

    ch: channels.Channel
    if decision.cycle_fusion is not None:
        if credit != 1 or credit_bytes is not None:
            raise InputError(
                f"policy {pol.name!r} runs its units one at a time; credit must be 1",
                field="credit_bytes" if credit_bytes is not None else "credit",
            )
        if agreed or queued:
            field = "agreed_readiness" if agreed else "queued"
            raise InputError(
                f"policy {pol.name!r} negotiates and runs its units itself (Horovod's "
                f"cycles); {field} applies to fixed units only",
                field=field,
            )
        ch = channels.CycleFusionChannel(
            prep,
            threshold_bytes=decision.cycle_fusion.threshold_bytes,
            cycle_us=decision.cycle_fusion.cycle_us,
            synchronous=decision.cycle_fusion.synchronous,
        )
        cu = None
    else:
        assert decision.units is not None
        cu = index_units(prep, decision.units, in_order=decision.in_order)
        if agreed:
            probe_us = trace.comm.cost_us(4 * len(prep.tensor_names))
            ch = channels.AgreedReadinessChannel(
                cu, credit, credit_bytes, queued=queued, probe_us=probe_us
            )
        else:
            ch = channels.StaticChannel(cu, credit, credit_bytes, queued=queued)

    cache: dict[str, Any] = {}
    interference = trace.comm.interference
    if interference is not None and not interference.active:
        interference = None
    # Interference couples compute to communication, so releases are no longer fixed
    # (Lemma 1's split does not hold): ops and channel run in one event loop.
    if serial or force_event_loop or interference is not None:
        joint = drivers.drive_joint(
            prep,
            ch,
            serial_compute=serial,
            barrier=barrier,
            interference=interference,
            update_us_per_byte=trace.comm.update_us_per_byte,
        )
        units, ustart, ufinish = ch.records()
        done = joint.tensor_done_us
        cache["op"] = (tuple(joint.op_start_us), tuple(joint.op_finish_us))
        comm_end = max(ufinish, default=0.0)
        iteration = max(max(joint.op_finish_us, default=0.0), comm_end)
        avail, gate = done, comm_end  # the op times are the event loop's (cached above)
    else:
        if cu is not None and not agreed and (credit == 1 or not queued):
            if credit == 1:
                # A byte window never binds with one unit in flight.
                ustart, ufinish = serial_replay(cu.ready_us, cu.cost_us, cu.priority)
            else:
                ustart, ufinish = channels.shared_static_replay(cu, credit, credit_bytes)
            units = cu.units
            done = tensor_done_us(cu, ufinish)
        else:
            done = drivers.drive_ideal(prep, ch)
            units, ustart, ufinish = ch.records()
        comm_end = max(ufinish, default=0.0)
        # The consumers (and a barrier) wait for the copy-back and the update after each
        # reduction, if any (Horovod's own fused calls copy inside their measured cost).
        copies = unit_copies(cu, ufinish) if cu is not None else []
        avail = updated_us(done, prep.size_bytes, trace.comm.update_us_per_byte, copies)
        gate = max(avail, default=0.0)
        iteration = window_us(max(prep.critical_path_us, comm_end), avail, prep.tail_us)
        if barrier and any(prep.gated):
            iteration = max(iteration, gate + prep.barrier_tail_us)

    busy = covered_us(zip(ustart, ufinish, strict=True))
    lazy = _Lazy(prep, avail, gate if barrier else None, cache)
    return SimResult(
        policy=pol.name,
        iteration_us=float(iteration),
        units=tuple(units),
        unit_start_us=tuple(ustart),
        unit_finish_us=tuple(ufinish),
        tensor_done_us=tuple(done),
        comm_busy_us=float(busy),
        comm_end_us=float(comm_end),
        options=opts,
        knobs=dict(decision.knobs),
        _lazy=lazy,
    )
