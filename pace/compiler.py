"""The compile pipeline: trace -> fusion plan -> schedule -> simulated baselines.

``compile_trace`` is what ``pace compile`` runs. Each stage is called through its public entry
function: ``pace.fusion.fuse`` (which already compiled and replayed its chosen plan with the exact
solver, so that schedule is reused), ``pace.lp.schedule`` (only when another solver is asked
for), ``pace.lp.lower_bound_us`` and ``pace.sim.compare`` for the baselines, all on the same
(possibly what-if) trace.
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
import math
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from pace.errors import InputError, SolverError
from pace.hedge import check_alternatives, least_regret, regrets, robust_to_compute
from pace.ir import (
    FRAMEWORK_POLICIES,
    SCHEDULE_MODES,
    FusionPlan,
    Schedule,
    ScheduleMode,
    Slice,
    Trace,
    Unit,
)
from pace.options import FUSION_METHODS, SOLVERS, FusionMethod, Solver
from pace.replay import start_order


@dataclass(frozen=True, kw_only=True, slots=True)
class CompileResult:
    """Everything ``pace compile`` reports.

    ``predicted_iteration_us`` is the simulator's replay of ``schedule`` (its own
    ``predicted_iteration_us``); ``lower_bound_us`` is the zero-overhead optimal preemptive
    makespan (at least ``pace.lp.interference_bound_us`` with an interference term), which no
    policy beats under any fusion; ``baselines`` maps each simulator policy to
    its replayed iteration time on the same trace. ``trace`` is the trace actually compiled (the
    what-if cost model applied). ``compile_seconds`` is the time to the schedule (fusion and
    scheduling); ``stage_seconds`` also times the lower bound and the baseline replays.
    """

    schedule: Schedule
    plan: FusionPlan
    trace: Trace
    predicted_iteration_us: float
    lower_bound_us: float
    baselines: Mapping[str, float]
    compile_seconds: float
    warnings: tuple[str, ...] = ()
    stage_seconds: Mapping[str, float] = field(default_factory=dict)
    # The framework's own path replayed on the same trace (``framework_path_us``), where the
    # trace measured it (``comm.framework``); ``schedule.framework`` says whether it won.
    framework_us: float | None = None

    @property
    def gap(self) -> float:
        """Relative distance of the prediction above the lower bound (0 = provably optimal)."""
        if self.lower_bound_us <= 0:
            return 0.0
        return self.predicted_iteration_us / self.lower_bound_us - 1.0


def framework_path_us(trace: Trace) -> float | None:
    """The framework's own path (``trace.comm.framework``) replayed on ``trace`` (as compiled:
    what-ifs and the mode applied), comparable with a compiled schedule's prediction there;
    ``None`` where the trace has no such measurement.

    Its calls cost what the framework's were measured to (``FrameworkPath``), beside compute
    as its own interference term says (the trace's where it has none), under the simulator
    policy that describes the path (``FRAMEWORK_POLICIES``). Its optimizer step runs on the
    training thread after every reduction, outside the replayed window, where the overlapped
    schedule's replay charges each unit's update inside it (``update_us_per_byte``); so the
    step the overlapped replay charges is added (0 in the sync mode, whose replay has none).
    """
    from pace.sim import simulate

    path = trace.comm.framework
    if path is None:
        return None
    step_us = trace.comm.update_us_per_byte * trace.total_bytes
    comm = dataclasses.replace(
        trace.comm,
        alpha_us=path.alpha_us,
        beta_us_per_byte=path.beta_us_per_byte,
        interference=path.interference
        if path.interference is not None
        else trace.comm.interference,
        update_us_per_byte=0.0,
        copy_us_per_byte=0.0,
        framework=None,
        # Measured under the runtime's settings; the path's cached calls were not batched.
        batched_alpha_us=None,
    )
    policy = FRAMEWORK_POLICIES[path.backend]
    return float(simulate(dataclasses.replace(trace, comm=comm), policy).iteration_us) + step_us


FRAMEWORK_MARGIN = 0.05
"""How much faster than the framework's own path the compiled units must replay to ship
(relative): below it the schedule is marked for the path. The path is the framework the user
would run anyway, so leaving it must pay beyond the model's error: the benchmark's predictions
are within 5% (docs/results.md), and on the throttled link units predicted 0.8%, 1.3% and 4.1%
faster than the path measured 10.6%, 1.8% and 4.0% slower than vanilla Horovod."""


def _weigh_framework(
    sched: Schedule,
    compiled: Trace,
    given: Trace,
    warnings: list[str],
    *,
    choose: bool,
    margin: float,
    worlds: Sequence[tuple[float, Trace]] = (),
) -> tuple[Schedule, float | None]:
    """``sched`` marked to train with the framework's own path where ``choose`` and its units
    do not replay at least ``margin`` faster than that path (``framework_path_us``); the
    path's replay time, or ``None`` where the trace has none.

    ``worlds`` (``compute_hedge``: each speed-up and the trace at it): the units also ship
    where, with the compute at those speeds too, they never replay slower than the path and
    beat it by ``margin`` at one of them (``meta.framework_weighed``). On the 1 Gbit/s
    Horovod trace of docs/results.md the units were 0.9% faster than the path on the
    calibration's compute, 5.2% with compute 1.1x faster and 8.6% at 1.25x: the margin alone
    trained the path, as fast as vanilla."""
    if compiled.comm.framework is None:
        if given.comm.framework is not None:
            warnings.append(
                "the framework's own path (comm.framework) is not weighed under a bandwidth or "
                "workers what-if: it was measured on the profiled link only"
            )
        return sched, None
    fw_us = framework_path_us(compiled)
    assert fw_us is not None
    if not choose or sched.predicted_iteration_us * (1.0 + margin) <= fw_us:
        return sched, fw_us
    if worlds and sched.predicted_iteration_us <= fw_us:
        from pace.sim import runtime_replay_us

        units_us = [runtime_replay_us(w, sched) for _, w in worlds]
        path_us = [framework_path_us(w) or 0.0 for _, w in worlds]
        pairs = list(zip(units_us, path_us, strict=True))
        if all(u <= f for u, f in pairs) and any(u * (1.0 + margin) <= f for u, f in pairs):
            weighed = {"speedups": [s for s, _ in worlds], "units_us": units_us, "path_us": path_us}
            meta = {**sched.meta, "framework_weighed": weighed}
            return dataclasses.replace(sched, meta=meta), fw_us
    backend = compiled.comm.framework.backend
    warnings.append(
        f"the compiled schedule ({sched.predicted_iteration_us:.1f} us) does not replay "
        f"{margin:.1%} faster than the framework's own path ({backend}, {fw_us:.1f} us): the "
        "runtime trains with that path (`--no-framework` to replay the units anyway, "
        "`--framework-margin` to change the margin)"
    )
    info = {
        "predicted_iteration_us": fw_us,
        "replay_us": sched.predicted_iteration_us,
        "margin": margin,
    }
    # predicted_iteration_us stays the units' replay (what `pace validate` checks); what the
    # runtime will train with is predicted in meta.framework.
    return dataclasses.replace(
        sched, framework=backend, meta={**sched.meta, "framework": info}
    ), fw_us


def apply_what_if(
    trace: Trace,
    *,
    bandwidth_gbps: float | None = None,
    workers: int | None = None,
    compute_speedup: float | None = None,
    mode: ScheduleMode = "overlap",
) -> Trace:
    """``trace`` as it would be on another cluster, or under another training loop.

    ``bandwidth_gbps`` / ``workers`` re-derive the all-reduce cost model (``pace.cost.what_if``).
    ``compute_speedup`` divides every op duration: a trace profiled on this CPU, replayed as if
    its computation ran ``compute_speedup`` times faster (an accelerator), with the same DAG,
    the same relative op costs and the same gradient sizes. CPU-profiled iterations take seconds,
    which hides any communication; this is how a CPU profile says something about a GPU cluster.
    ``mode="sync"``: the loop of the runtime's synchronous mode (``wrap(..., sync=True)``, DDP's
    contract), where ``backward()`` returns only once every gradient is reduced; see
    ``sync_trace``.

    >>> from pace.synth import random_trace
    >>> t = random_trace(seed=1, n_layers=2)
    >>> fast = apply_what_if(t, compute_speedup=10)
    >>> fast.ops[0].duration_us * 10 == t.ops[0].duration_us
    True
    """
    if compute_speedup is not None:
        if not (isinstance(compute_speedup, int | float) and compute_speedup > 0) or not (
            compute_speedup < float("inf")
        ):
            raise InputError(
                f"must be a finite number > 0, got {compute_speedup!r}", where="--compute-speedup"
            )
        ops = tuple(
            dataclasses.replace(op, duration_us=op.duration_us / compute_speedup)
            for op in trace.ops
        )
        meta = {**trace.meta, "compute_speedup": compute_speedup}
        # The update of a reduced gradient and its copy-back are computation too: they speed
        # up with the ops.
        comm = dataclasses.replace(
            trace.comm,
            update_us_per_byte=trace.comm.update_us_per_byte / compute_speedup,
            copy_us_per_byte=trace.comm.copy_us_per_byte / compute_speedup,
        )
        trace = dataclasses.replace(trace, ops=ops, meta=meta, comm=comm)
    if mode not in SCHEDULE_MODES:
        raise InputError(f"must be one of {', '.join(SCHEDULE_MODES)}, got {mode!r}", field="mode")
    if mode == "sync":
        trace = sync_trace(trace)
    if bandwidth_gbps is None and workers is None:
        return trace
    from pace.cost import what_if

    comm = what_if(trace.comm, bandwidth_gbps=bandwidth_gbps, workers=workers)
    return dataclasses.replace(trace, comm=comm)


def sync_trace(trace: Trace) -> Trace:
    """``trace`` for a loop whose next forward pass waits for every gradient's all-reduce.

    The simulator's barrier (``SimOptions(barrier=True)``) as a trace: every forward op that the
    barrier holds back (one that does not feed a producer) and that no other held-back op
    precedes now consumes every tensor, so the whole compile pipeline (fusion, the exact
    solver, the replay) optimises this loop unchanged. The op DAG is kept, so the trace digest
    changes; a schedule records its ``mode`` and keeps the digest of the trace it was given.

    >>> from pace.synth import random_trace
    >>> from pace.sim import SimOptions, simulate
    >>> t = random_trace(seed=3, n_layers=4)
    >>> simulate(sync_trace(t), "fifo").iteration_us == simulate(
    ...     t, "fifo", options=SimOptions(barrier=True)
    ... ).iteration_us
    True
    """
    from pace.analysis import analyze

    prep = analyze(trace)
    gated = prep.gated
    roots = tuple(
        trace.ops[i].name
        for i in range(len(trace.ops))
        if gated[i] and not any(gated[j] for j in prep.deps[i])
    )
    # The sync loop's step() runs on the training thread after every reduction, outside the
    # replayed window (as a framework's): no gradient waits for its own update in it.
    comm = dataclasses.replace(trace.comm, update_us_per_byte=0.0)
    if not roots:
        return dataclasses.replace(trace, comm=comm) if trace.comm != comm else trace
    tensors = tuple(
        dataclasses.replace(t, consumers=tuple(dict.fromkeys((*t.consumers, *roots))))
        for t in trace.tensors
    )
    return dataclasses.replace(
        trace, tensors=tensors, comm=comm, meta={**trace.meta, "mode": "sync"}
    )


def _fuse_and_schedule(
    compiled: Trace,
    *,
    fusion: FusionMethod,
    solver: Solver,
    robust: bool,
    tol: float,
    stages: dict[str, float],
    warnings: list[str],
) -> tuple[Schedule, FusionPlan]:
    """Fusion, then the scheduler on the chosen plan (``fuse`` already scheduled it with the
    exact solver; that result is reused). Times its stages into ``stages``."""
    from pace.fusion import fuse
    from pace.lp import schedule as lp_schedule

    t = time.perf_counter()
    # The scheduler takes the references only with a per-call latency or a robust choice
    # (lp.schedule): otherwise building P3's slices is work for nothing.
    references = reference_units(compiled) if compiled.comm.alpha_us > 0 or robust else {}

    def schedule(plan: FusionPlan, *, solver: Solver) -> Schedule:
        return lp_schedule(
            compiled,
            plan,
            solver=solver,
            robust=robust,
            robust_tolerance=tol,
            references=references,
        ).schedule

    outcome = fuse(
        compiled, method=fusion, robust=robust, robust_tolerance=tol, references=references
    )
    plan = outcome.plan
    stages["fusion"] = time.perf_counter() - t

    t = time.perf_counter()
    exact = outcome.schedule.schedule if outcome.schedule is not None else None
    if solver == "exact":
        sched = exact or schedule(plan, solver="exact")
    else:
        try:
            sched = schedule(plan, solver=solver)
        except SolverError as exc:
            warnings.append(f"solver {solver!r} failed ({type(exc).__name__}: {exc}); used 'exact'")
            sched = exact or schedule(plan, solver="exact")
        else:
            # The slotted LP rounds times to whole slots; never ship a schedule that replays
            # slower than the exact solver's for the same plan.
            exact = exact or schedule(plan, solver="exact")
            if exact.predicted_iteration_us < sched.predicted_iteration_us:
                warnings.append(
                    f"the {solver!r} schedule replays {sched.predicted_iteration_us:.1f} us "
                    "(slot rounding); kept the exact solver's "
                    f"{exact.predicted_iteration_us:.1f} us"
                )
                sched = exact
    stages["schedule"] = time.perf_counter() - t
    return sched, plan


def reference_units(trace: Trace) -> dict[str, tuple[Unit, ...]]:
    """The baselines whose own unit lists the scheduler takes as candidates, so the compiled
    schedule never replays slower than they do: P3's (fixed-size slices in layer order, one
    call in flight: the contract's own replay); none over the simulator's unit limit (then
    P3 is no baseline either). The FIFO and TicTac orders are the scheduler's own candidates;
    fusing baselines are the fusion stage's match."""
    from pace.analysis import analyze
    from pace.errors import LimitError
    from pace.sim import SimOptions
    from pace.sim.policies import p3

    try:
        units = p3().build(analyze(trace), SimOptions()).units
    except LimitError:
        return {}
    return {"p3": units} if units is not None else {}


def best_lower_bound_us(trace: Trace) -> tuple[float, str]:
    """The best available lower bound on any policy's iteration time, and its name.

    The zero-overhead optimal preemptive makespan (``pace.lp.lower_bound_us``), else (its
    solver failed) the compute critical path; ``interference`` where the trace's interference
    term gives the higher one (``pace.lp.interference_bound_us``).
    """
    from pace.analysis import analyze
    from pace.lp import interference_bound_us, lower_bound_us

    interference = interference_bound_us(trace)
    try:
        bound, kind = float(lower_bound_us(trace)), "optimal-preemptive"
    except SolverError:
        # A bound is a reference line, not worth failing a comparison over.
        bound, kind = analyze(trace).critical_path_us, "critical-path"
    if interference >= bound:
        return interference, "interference"
    return bound, kind


def _start_order(schedule: Schedule, unit_start_us: Sequence[float]) -> list[int]:
    return start_order(unit_start_us, [u.priority for u in schedule.units])


def in_issue_order(schedule: Schedule, trace: Trace) -> Schedule:
    """``schedule`` with its priorities renumbered 0, 1, ... in the order its own replay starts
    the units.

    The replay contract starts the ready unit with the smallest priority, so a schedule may
    list a unit first that is ready late, and the replay sends later ones before it. The
    runtime cannot: every rank must issue the same collectives in the same order without
    negotiating, so it issues units strictly in priority order, each once its gradients are
    ready, and one ready late holds back all after it. Numbered by the replay's start order,
    the replay makes the same choice at every step (the unit it started was the smallest
    priority ready then, and every smaller one had started), so the prediction is unchanged,
    and the runtime's strict order is the replay's order.
    """
    from pace.sim import schedule_policy, simulate

    order = _start_order(schedule, simulate(trace, schedule_policy(schedule)).unit_start_us)
    if all(schedule.units[u].priority == float(pos) for pos, u in enumerate(order)):
        return schedule
    return _numbered(schedule, order)


def _numbered(schedule: Schedule, order: Sequence[int]) -> Schedule:
    """``schedule`` with its units' priorities 0, 1, ... in ``order`` (unit indices)."""
    rank = {u: float(pos) for pos, u in enumerate(order)}
    units = tuple(
        dataclasses.replace(unit, priority=rank[u]) for u, unit in enumerate(schedule.units)
    )
    return dataclasses.replace(schedule, units=units)


def issue_order_problem(schedule: Schedule, unit_start_us: Sequence[float]) -> str | None:
    """Why the runtime would not send ``schedule``'s units in the order its replay starts them
    (``unit_start_us``), or ``None``: the first pair whose priorities run against their start
    times (see ``in_issue_order``)."""
    units = schedule.units
    for prev, nxt in itertools.pairwise(_start_order(schedule, unit_start_us)):
        if units[nxt].priority < units[prev].priority:
            return (
                f"unit {nxt} (priority {units[nxt].priority:g}) starts after unit {prev} "
                f"(priority {units[prev].priority:g}) in the replay, but the runtime issues "
                f"strictly in priority order: unit {prev} would wait behind it, slower than "
                "predicted. Compile again (`pace compile` numbers them in start order)"
            )
    return None


def _hedged(
    models: Sequence[Trace],
    candidates: Sequence[tuple[Schedule, FusionPlan]],
    under: Sequence[int],
) -> tuple[Schedule, FusionPlan]:
    """The candidate (``candidates[i]`` compiled under ``models[under[i]]``) with the least
    worst regret over the models; its prediction is its replay under ``models[0]``."""
    from pace.io import trace_digest
    from pace.sim import schedule_policy, simulate

    replays = [
        [simulate(m, schedule_policy(s)).iteration_us for m in models] for s, _ in candidates
    ]
    pick = least_regret(replays)
    sched, plan = candidates[pick]
    info = {
        "models": len(models),
        "compiled_under": list(under),
        "order_searched": ["order_search" in s.meta and s.in_order for s, _ in candidates],
        "chosen": pick,
        "replays_us": replays,
        "regret": regrets(replays),
    }
    return dataclasses.replace(
        sched,
        trace_digest=trace_digest(models[0]),
        cost_model=models[0].comm,
        predicted_iteration_us=replays[pick][0],
        meta={**sched.meta, "hedge": info},
    ), plan


def _compute_hedged(
    compiled: Trace,
    chosen: tuple[Schedule, FusionPlan],
    worlds: Sequence[tuple[float, Trace]],
    *,
    fusion: FusionMethod,
    solver: Solver,
    robust: bool,
    tol: float,
    warnings: list[str],
    search: Callable[[Schedule], Schedule] | None = None,
) -> tuple[Schedule, FusionPlan]:
    """``chosen`` (in issue order), or a schedule compiled for one of ``worlds`` (``compiled``
    with its compute each speed-up times faster) that replays no more than ``tol`` slower on
    ``compiled`` and loses least where the compute runs at those speeds
    (``pace.hedge.robust_to_compute``). ``search`` (the order search): each compiled
    schedule is a candidate as numbered on its world and as its order search leaves it.

    Every candidate is replayed as the runtime runs it: issued strictly in priority order
    (``in_order``), numbered by its start order on the trace it was compiled for
    (``in_issue_order``)."""
    from pace.sim import runtime_replay_us

    alt_warnings: list[list[str]] = [[] for _ in worlds]
    candidates = [chosen]
    labels = ["the pipeline's"]
    warned_by: list[list[str]] = [[]]
    for (speedup, world), ws in zip(worlds, alt_warnings, strict=True):
        sched, plan = _fuse_and_schedule(
            world, fusion=fusion, solver=solver, robust=robust, tol=tol, stages={}, warnings=ws
        )
        numbered = in_issue_order(sched, world)
        candidates.append((numbered, plan))
        labels.append(f"compiled at x{speedup:g}")
        warned_by.append(ws)
        if search is not None and (searched := search(numbered)).units != numbered.units:
            candidates.append((searched, plan))
            labels.append(f"compiled at x{speedup:g}, order searched")
            warned_by.append(ws)
    nominal = [runtime_replay_us(compiled, s) for s, _ in candidates]
    replays = [[runtime_replay_us(w, s) for _, w in worlds] for s, _ in candidates]
    pick = robust_to_compute(nominal, replays, tolerance=tol)
    info = {
        "speedups": [float(s) for s, _ in worlds],
        "candidates": labels,
        "tolerance": tol,
        "chosen": pick,
        "nominal_us": nominal,
        "replays_us": replays,
    }
    incumbent = chosen[0]
    if pick == 0:
        return dataclasses.replace(
            incumbent, meta={**incumbent.meta, "compute_hedge": info}
        ), chosen[1]
    warnings.extend(warned_by[pick])
    sched, plan = candidates[pick]
    kept = {k: incumbent.meta[k] for k in ("hedge",) if k in incumbent.meta}
    # The trace's digest and cost model, not the scaled world's it was compiled on; numbered
    # in its start order there, its replay on the trace is the runtime's strict order, which
    # the contract's replay (a ready later unit first) need not match: the file says so.
    return dataclasses.replace(
        sched,
        trace_digest=incumbent.trace_digest,
        cost_model=incumbent.cost_model,
        predicted_iteration_us=nominal[pick],
        in_order=True,
        meta={**sched.meta, **kept, "compute_hedge": info},
    ), plan


ORDER_SEARCH_MAX_UNITS = 64
"""Schedules with more units keep their order and units: the search tries every single move
(units squared per pass), each one replay of the iteration."""

ORDER_SEARCH_BUDGET = 1000
"""Replays the order search may spend (about 1 s on a 40-unit schedule of a 1,500-op trace)."""


def _coalesced(slices: Sequence[Slice]) -> tuple[Slice, ...]:
    """``slices`` with the pieces of one tensor that touch joined into one slice, each tensor
    where it first appears: joined pieces of a whole tensor are one unit reduced in place, not
    a fused buffer packed and copied back (``Unit.fused``)."""
    by_tensor: dict[str, list[Slice]] = {}
    for s in slices:
        by_tensor.setdefault(s.tensor, []).append(s)
    out: list[Slice] = []
    for tensor, pieces in by_tensor.items():
        pieces.sort(key=lambda s: s.offset_bytes)
        start, end = pieces[0].offset_bytes, pieces[0].offset_bytes + pieces[0].size_bytes
        for s in pieces[1:]:
            if s.offset_bytes == end:
                end += s.size_bytes
                continue
            out.append(Slice(tensor=tensor, offset_bytes=start, size_bytes=end - start))
            start, end = s.offset_bytes, s.offset_bytes + s.size_bytes
        out.append(Slice(tensor=tensor, offset_bytes=start, size_bytes=end - start))
    return tuple(out)


def _grouped(schedule: Schedule, groups: Sequence[tuple[int, ...]]) -> Schedule:
    """``schedule`` issuing ``groups`` in this order: each group of its units (indices) one
    unit, priorities 0, 1, ...; a schedule whose groups are single units keeps them as they are,
    renumbered."""
    if all(len(g) == 1 for g in groups):
        return _numbered(schedule, [g[0] for g in groups])
    units = tuple(
        Unit(
            priority=float(pos),
            slices=_coalesced([s for u in g for s in schedule.units[u].slices]),
        )
        for pos, g in enumerate(groups)
    )
    return dataclasses.replace(schedule, units=units)


def _order_searched(
    compiled: Trace, judges: Sequence[Trace], sched: Schedule, *, join_units: bool = True
) -> Schedule:
    """``sched`` with the issue order and units ``pace.order_search.descend`` finds from its
    own (moves in the order, joins of two units, splits of one where two of its slices meet:
    ``regroupings``) under the runtime's strict-order replay on ``compiled``, no step slower on
    any of ``judges`` (the hedged cost models); renumbered and marked ``in_order`` where it
    changed (the prediction is then that replay: the contract's work-conserving replay would
    send a held-back unit early). ``join_units=False``: moves in the order only
    (``pace.order_search.moves``)."""
    from pace.analysis import analyze
    from pace.order_search import descend, moves, regroupings
    from pace.sim import runtime_replay_us

    units = sched.units
    if len(units) > ORDER_SEARCH_MAX_UNITS:
        info: dict[str, Any] = {
            "skipped": f"{len(units)} units, over {ORDER_SEARCH_MAX_UNITS}: the order is kept"
        }
        return dataclasses.replace(sched, meta={**sched.meta, "order_search": info})

    # The search's members are the units' slices, each unit's listed in ready order (so that a
    # split cuts it where an earlier part could go before a later one); it starts from the
    # units as they are, each a group of its slices.
    prep = analyze(compiled)
    index = prep.tensor_index
    pieces: list[Slice] = []
    start: list[tuple[int, ...]] = []
    for u in sorted(units, key=lambda u: u.priority):
        mine = sorted(
            u.slices,
            key=lambda s: (prep.release_us[index[s.tensor]], index[s.tensor], s.offset_bytes),
        )
        start.append(tuple(range(len(pieces), len(pieces) + len(mine))))
        pieces.extend(mine)
    grouped = functools.partial(
        _grouped,
        dataclasses.replace(
            sched, units=tuple(Unit(priority=float(i), slices=(s,)) for i, s in enumerate(pieces))
        ),
    )
    # A unit is one buffer of one dtype (the runtime refuses a fused unit that mixes them): join
    # only pieces whose tensors have one fusion kind (element size and dtype).
    kind_of = [prep.fusion_kind[index[s.tensor]] for s in pieces]

    def steps(groups: Sequence[tuple[int, ...]]) -> Iterator[list[tuple[int, ...]]]:
        for cand in regroupings(groups) if join_units else moves(groups):
            if all(len({kind_of[p] for p in g}) == 1 for g in cand):
                yield cand

    joined = split = 0

    def count(before: Sequence[tuple[int, ...]], after: Sequence[tuple[int, ...]]) -> None:
        nonlocal joined, split
        joined += int(len(after) < len(before))
        split += int(len(after) > len(before))

    result = descend(
        start,
        lambda groups: runtime_replay_us(compiled, grouped(groups)),
        others=lambda groups: [runtime_replay_us(j, grouped(groups)) for j in judges],
        budget=ORDER_SEARCH_BUDGET,
        neighbours=steps,
        on_step=count,
    )
    info = {
        "moves": result.moves,
        # The steps that were joins of two units and splits of one (the rest: moves in order).
        "joins": joined,
        "splits": split,
        "replays": result.evaluations,
        "local_optimum": not result.exhausted,
        "before_us": [result.start_objective, *result.start_others],
        "after_us": [result.objective, *result.others],
    }
    if result.moves == 0:
        return dataclasses.replace(sched, meta={**sched.meta, "order_search": info})
    return dataclasses.replace(
        grouped(result.order),
        in_order=True,
        predicted_iteration_us=result.objective,
        meta={**sched.meta, "order_search": info},
    )


def compile_trace(
    trace: Trace,
    *,
    fusion: FusionMethod = "search",
    solver: Solver = "exact",
    bandwidth_gbps: float | None = None,
    workers: int | None = None,
    compute_speedup: float | None = None,
    mode: ScheduleMode = "overlap",
    baselines: bool = True,
    robust: bool | None = None,
    robust_tolerance: float | None = None,
    hedge: Sequence[Trace] = (),
    compute_hedge: Sequence[float] = (),
    framework: bool = True,
    framework_margin: float | None = None,
    order_search: bool = True,
    join_units: bool = True,
) -> CompileResult:
    """Fuse, schedule and measure ``trace`` (see the module docstring).

    ``fusion`` is ``"search"`` (default), ``"paper"`` (PACE Alg. 1) or ``"none"``; ``solver`` is
    ``"exact"`` or ``"lp"`` (on a ``SolverError``, or when the LP's schedule replays slower than
    the exact solver's, the exact one is used and a warning recorded). ``bandwidth_gbps`` and
    ``workers`` compile for a what-if cost model; ``compute_speedup`` for faster computation
    (``apply_what_if``). A compute what-if changes op durations, hence the trace digest: the
    schedule keeps the digest of the trace it was given (so it still matches that file and the
    model) and records ``compute_speedup`` (``meta.compute_speedup`` in the file), which every
    replay (``pace validate``, ``simulate``, drift) re-applies.
    ``mode="sync"`` compiles for the runtime's synchronous mode (``sync_trace``; the schedule
    records its ``mode`` and the runtime refuses a mismatch); the baselines are replayed on the
    same loop.
    ``robust`` (default ``pace.lp.ROBUST_DEFAULT``): among candidates nominally within a small
    tolerance of the best, pick the one with the best mean replay under timing jitter
    (``pace.lp.schedule``; ``docs/scheduling.md``, "Robustness to jitter");
    ``robust_tolerance`` (default ``pace.lp.ROBUST_TOLERANCE``, 0.5%) is that tolerance.
    ``hedge``: other cost models of the same job (same ops and tensors, another ``comm``),
    where a part of the model is uncertain: the job is compiled under each too, every schedule
    is replayed under every model, and the one with the least worst relative regret ships
    (``pace.hedge``; ties keep ``trace``'s own). Its prediction is its replay under ``trace``,
    which may then be slower than a baseline's there (the warning says so): the hedge trades
    time under one model for less loss under the others. ``meta.hedge`` records the replays
    and regrets.
    ``compute_hedge``: compute speed-ups (``2.0``: the ops take half as long; ``0.8``: 1.25x as
    long) the job may run at instead of the trace's: the trace is also compiled at each, and
    a schedule replaying no more than ``robust_tolerance`` slower than the pipeline's choice
    on the trace ships where it loses least at those speeds (``pace.hedge.robust_to_compute``;
    every candidate replayed in the runtime's strict issue order). ``meta.compute_hedge``
    records the replays.
    ``framework``: where the trace measured the framework's own path (``comm.framework``) and
    the compiled schedule does not replay ``framework_margin`` (default ``FRAMEWORK_MARGIN``,
    5%) faster than it (``framework_path_us``), ship the schedule marked ``framework`` (the
    runtime then trains with that path; the units and their prediction stay),
    ``meta.framework`` holding both predictions and the margin; ``False``: never
    (``--no-framework``). Either way ``framework_us`` is that path's prediction.
    ``order_search`` (default on; ``--no-order-search``): the chosen schedule's issue order is
    searched under the runtime's strict-order replay, a move kept only where it is faster on
    the trace and no slower under every ``hedge`` model (``pace.order_search``); a changed
    order ships with ``in_order`` and its runtime-order replay as the prediction. With
    ``compute_hedge`` each schedule compiled at a hedged speed is a candidate as numbered
    there and as searched. ``meta.order_search`` records it. The search also joins two units
    into one where that is faster (``join_units``, default on; ``--no-join-units``: its moves
    only; never with ``fusion="none"``, which asks for no fusion).

    >>> from pace.synth import random_trace
    >>> r = compile_trace(random_trace(seed=2, n_layers=5, alpha_us=30.0))
    >>> r.lower_bound_us <= r.predicted_iteration_us <= r.baselines["fifo"]
    True
    """
    if fusion not in FUSION_METHODS:
        raise InputError(
            f"must be one of {', '.join(FUSION_METHODS)}, got {fusion!r}", field="fusion"
        )
    if solver not in SOLVERS:
        raise InputError(f"must be one of {', '.join(SOLVERS)}, got {solver!r}", field="solver")
    from pace.lp import ROBUST_DEFAULT, ROBUST_TOLERANCE, lower_bound_us
    from pace.sim import compare

    # `fusion="none"` asks for one unit per tensor (or its LP pieces): nothing joined either.
    join_units = join_units and fusion != "none"

    robust_on = ROBUST_DEFAULT if robust is None else robust
    margin = FRAMEWORK_MARGIN if framework_margin is None else framework_margin
    if not (math.isfinite(margin) and margin >= 0.0):
        raise InputError(f"must be a finite number >= 0, got {margin}", field="framework_margin")
    tol = ROBUST_TOLERANCE if robust_tolerance is None else robust_tolerance
    check_alternatives(trace, hedge)
    for speedup in compute_hedge:
        if not (isinstance(speedup, int | float) and 0.0 < speedup < math.inf):
            raise InputError(
                f"compute speed-ups must be finite numbers > 0, got {speedup!r}",
                field="compute_hedge",
            )

    t0 = time.perf_counter()
    stages: dict[str, float] = {}
    warnings: list[str] = []
    compiled = apply_what_if(
        trace,
        bandwidth_gbps=bandwidth_gbps,
        workers=workers,
        compute_speedup=compute_speedup,
        mode=mode,
    )
    sched, plan = _fuse_and_schedule(
        compiled,
        fusion=fusion,
        solver=solver,
        robust=robust_on,
        tol=tol,
        stages=stages,
        warnings=warnings,
    )
    # Compile time is the time to the schedule; the bound and the baselines are measurements.
    compile_seconds = time.perf_counter() - t0

    t = time.perf_counter()
    bound = float(lower_bound_us(compiled))
    stages["lower_bound"] = time.perf_counter() - t

    base: dict[str, float] = {}
    if baselines:
        t = time.perf_counter()
        skipped: dict[str, str] = {}
        base = {
            name: float(res.iteration_us)
            for name, res in compare(compiled, skipped=skipped).items()
        }
        warnings.extend(f"baseline {name!r} not replayed: {why}" for name, why in skipped.items())
        stages["baselines"] = time.perf_counter() - t
        # The guarantee, owned here: never ship a schedule that replays slower than a simulated
        # baseline when a nominal compile avoids it. The robust choice trades up to `tol` of
        # nominal time for jitter tolerance; if that lets a baseline win, compile nominally and
        # keep whichever replays faster.
        beaten = {n: us for n, us in base.items() if us < sched.predicted_iteration_us}
        if beaten and robust_on:
            t = time.perf_counter()
            nominal_warnings: list[str] = []
            nominal, nominal_plan = _fuse_and_schedule(
                compiled,
                fusion=fusion,
                solver=solver,
                robust=False,
                tol=tol,
                stages={},
                warnings=nominal_warnings,
            )
            stages["nominal_fallback"] = time.perf_counter() - t
            compile_seconds += stages["nominal_fallback"]
            if nominal.predicted_iteration_us < sched.predicted_iteration_us:
                sched = dataclasses.replace(
                    nominal,
                    meta={
                        **nominal.meta,
                        "robust_dropped": "a baseline replays faster than the robust choice",
                    },
                )
                plan = nominal_plan
                warnings.extend(nominal_warnings)
    # The other cost models, as compiled: the hedge chooses on them and the order search keeps
    # no move that is slower on one.
    alternatives = [
        apply_what_if(
            alt,
            bandwidth_gbps=bandwidth_gbps,
            workers=workers,
            compute_speedup=compute_speedup,
            mode=mode,
        )
        for alt in hedge
    ]
    if hedge:
        t = time.perf_counter()
        models = [compiled, *alternatives]
        # Each alternative's own warnings (a solver fallback, ...) count if its schedule ships.
        alt_warnings: list[list[str]] = [[] for _ in hedge]
        others = [
            _fuse_and_schedule(
                m, fusion=fusion, solver=solver, robust=robust_on, tol=tol, stages={}, warnings=w
            )
            for m, w in zip(models[1:], alt_warnings, strict=True)
        ]
        candidates = [(sched, plan), *others]
        under = list(range(len(models)))
        if order_search:
            # Each model's schedule also as its own compile would ship it, its order searched
            # under that model, so the hedge weighs what each alone would give; the unsearched
            # one stays a candidate (in the strict order a searched schedule is less adaptive
            # under another model than the contract's replay of the unsearched one).
            for i, (m, (s, p)) in enumerate(zip(models, list(candidates), strict=True)):
                searched = _order_searched(m, (), in_issue_order(s, m), join_units=join_units)
                if searched.meta["order_search"].get("moves"):
                    candidates.append((searched, p))
                    under.append(i)
        sched, plan = _hedged(models, candidates, under)
        if (pick := under[sched.meta["hedge"]["chosen"]]) > 0:
            warnings.extend(alt_warnings[pick - 1])
        stages["hedge"] = time.perf_counter() - t
        compile_seconds += stages["hedge"]
    # (A schedule whose order was searched is in the runtime's order already: left as it is.)
    sched = in_issue_order(sched, compiled)
    # The order search, judged on the trace and under every hedged cost model (so the cost
    # hedge's choice is not undone), applied to the pipeline's choice and to each schedule the
    # compute hedge weighs, which then chooses among them as among any candidates.
    search = (
        functools.partial(_order_searched, compiled, alternatives, join_units=join_units)
        if order_search
        else None
    )
    if search is not None:
        t = time.perf_counter()
        sched = search(sched)
        stages["order_search"] = time.perf_counter() - t
        compile_seconds += stages["order_search"]
    # The trace with its compute at each hedged speed: the schedules are chosen on them, and
    # the framework's path is weighed on the same.
    worlds = [(s, apply_what_if(compiled, compute_speedup=s)) for s in compute_hedge]
    if worlds:
        t = time.perf_counter()
        sched, plan = _compute_hedged(
            compiled,
            (sched, plan),
            worlds,
            fusion=fusion,
            solver=solver,
            robust=robust_on,
            tol=tol,
            warnings=warnings,
            search=search,
        )
        stages["compute_hedge"] = time.perf_counter() - t
        compile_seconds += stages["compute_hedge"]
    if base:
        beaten = {n: us for n, us in base.items() if us < sched.predicted_iteration_us}
        if beaten:
            best = min(beaten, key=beaten.__getitem__)
            warnings.append(
                f"baseline {best!r} replays faster ({beaten[best]:.1f} us) than the compiled "
                f"schedule ({sched.predicted_iteration_us:.1f} us)"
            )
    sched, framework_us = _weigh_framework(
        sched,
        compiled,
        trace,
        warnings,
        choose=framework,
        margin=margin,
        worlds=worlds,
    )
    if compute_speedup is not None or mode != "overlap":
        # The schedule keeps the digest of the trace it was given and records what changes the
        # meaning of its replay (pace validate re-applies it).
        from pace.io import trace_digest

        sched = dataclasses.replace(
            sched, trace_digest=trace_digest(trace), mode=mode, compute_speedup=compute_speedup
        )
    return CompileResult(
        schedule=sched,
        plan=plan,
        trace=compiled,
        predicted_iteration_us=float(sched.predicted_iteration_us),
        lower_bound_us=bound,
        baselines=base,
        compile_seconds=compile_seconds,
        warnings=tuple(warnings),
        stage_seconds=stages,
        framework_us=framework_us,
    )
