"""The simulator's event loops: they run a channel (``pace.sim.channels``) against the ops.

:func:`drive_ideal` (release times known, compute never waits on the channel) and
:func:`drive_joint` (ops and channel in one event loop; needed for one compute stream and for
an interference term, also usable for ideal compute as an independent cross-check of the fast
path); :func:`ideal_op_times` derives op times from tensor done times under ideal compute.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Sequence
from dataclasses import dataclass

from pace.analysis import TraceAnalysis
from pace.errors import InputError
from pace.ir import Interference
from pace.sim.channels import Channel, CycleFusionChannel

_INF = math.inf


def _channel_step(ch: Channel, now: float) -> list[int]:
    done = ch.advance(now)
    if isinstance(ch, CycleFusionChannel):
        ch.after_batch(now)
    return done


def drive_ideal(prep: TraceAnalysis, ch: Channel) -> list[float]:
    """Replay ``ch`` with release times from the compute-only schedule; tensor done times."""
    release = prep.release_us
    order = prep.ready_order
    n = len(order)
    done_us = [_INF] * n
    i = 0
    while True:
        tn = release[order[i]] if i < n else _INF
        tc = ch.next_time()
        t = tn if tn < tc else tc
        if t == _INF:
            break
        while i < n and release[order[i]] == t:
            ch.produce(order[i], t)
            i += 1
        for k in _channel_step(ch, t):
            done_us[k] = t
        ch.dispatch(t)
    return done_us


@dataclass(frozen=True, kw_only=True, slots=True)
class JointResult:
    op_start_us: list[float]
    op_finish_us: list[float]
    tensor_done_us: list[float]


def drive_joint(
    prep: TraceAnalysis,
    ch: Channel,
    *,
    serial_compute: bool,
    barrier: bool,
    interference: Interference | None = None,
    update_us_per_byte: float = 0.0,
) -> JointResult:
    """Ops and channel in one event loop.

    ``serial_compute``: ops run one at a time on one stream; when the stream is free it starts
    the ready op that became ready earliest (ties in trace order). Otherwise every ready op
    starts at once (ideal compute). ``barrier``: gated forward ops also wait for every tensor.
    ``interference``: running ops progress at ``1 - ch.compute_loss(...)`` of their speed (the
    trace's ``comm.interference``). Their progress is one clock, ``progress``, which runs at
    that rate between events; an op finishes when the clock has advanced by its duration since
    it started. Without interference the clock is real time. ``update_us_per_byte``: the
    tensors a channel event completes are updated on one update thread, one event's tensors
    after the other's, for this much per byte, after the copy-back of the units the event
    finished (``Channel.copy_us``), and only then reach their consumers (and the barrier);
    ``tensor_done_us`` stays the reduction's end.
    """
    n_ops = len(prep.op_names)
    n_t = len(prep.tensor_names)
    dur = prep.duration_us
    blockers = [len(prep.deps[i]) + len(prep.consumes[i]) for i in range(n_ops)]
    if barrier:
        for i in range(n_ops):
            if prep.gated[i]:
                blockers[i] += 1
    start = [_INF] * n_ops
    finish = [_INF] * n_ops
    done_us = [_INF] * n_t
    tensors_left = n_t
    events: list[tuple[float, int]] = []  # (progress clock at the op's finish, op)
    ready_ops: list[tuple[float, int]] = []  # (ready time, op) for the serial stream
    stream_busy = False
    progress = 0.0
    rate = 1.0 if interference is None else 1.0 - interference.idle_loss
    size = prep.size_bytes
    updated: list[tuple[float, int]] = []  # (update end, tensor), not yet given to consumers
    update_free = 0.0  # when the update thread is next idle

    def make_ready(i: int, now: float) -> None:
        if serial_compute:
            heapq.heappush(ready_ops, (now, i))
        else:
            start[i] = now
            heapq.heappush(events, (progress + dur[i], i))

    def release_barrier(now: float) -> None:
        for i in range(n_ops):
            if prep.gated[i]:
                blockers[i] -= 1
                if blockers[i] == 0:
                    make_ready(i, now)

    for i in range(n_ops):
        if blockers[i] == 0:
            make_ready(i, 0.0)
    if barrier and tensors_left == 0:
        release_barrier(0.0)

    now = 0.0
    while True:
        if serial_compute and not stream_busy and ready_ops:
            i = heapq.heappop(ready_ops)[1]
            start[i] = now
            heapq.heappush(events, (progress + dur[i], i))
            stream_busy = True
        t_op = _INF
        if events:
            t_op = events[0][0] if interference is None else now + (events[0][0] - progress) / rate
        t_ch = ch.next_time()
        t_up = updated[0][0] if updated else _INF
        t = min(t_op, t_ch, t_up)
        if t == _INF:
            break
        if interference is None:
            progress = t
        else:  # the clock reaches an op's finish exactly when that op is the next event
            progress = events[0][0] if t == t_op else progress + (t - now) * rate
        now = t
        while events and events[0][0] <= progress:
            i = heapq.heappop(events)[1]
            finish[i] = t
            if serial_compute:
                stream_busy = False
            for k in prep.produces[i]:
                ch.produce(k, t)
            for c in prep.children[i]:
                blockers[c] -= 1
                if blockers[c] == 0:
                    make_ready(c, t)
        if t_ch == t:
            reduced = _channel_step(ch, t)
            for k in reduced:
                done_us[k] = t
            copy_us = ch.copy_us()
            if (update_us_per_byte > 0 and reduced) or copy_us > 0:
                # The completion thread: the copy-back, then the update (``updated_us``).
                update_free = (
                    max(update_free, t)
                    + copy_us
                    + update_us_per_byte * sum(size[k] for k in reduced)
                )
                for k in reduced:
                    heapq.heappush(updated, (update_free, k))
                reduced = []
            released = reduced
        else:
            released = []
        while updated and updated[0][0] <= t:
            released.append(heapq.heappop(updated)[1])
        for k in released:
            tensors_left -= 1
            for c in prep.consumers[k]:
                blockers[c] -= 1
                if blockers[c] == 0:
                    make_ready(c, t)
            if barrier and tensors_left == 0:
                release_barrier(t)
        if isinstance(ch, CycleFusionChannel):
            ch.after_batch(t)
        if interference is None:
            ch.dispatch(t)
            continue
        computing = stream_busy if serial_compute else bool(events)
        ch.call_extra_us = interference.comm_us_per_call if computing else 0.0
        ch.dispatch(t)
        ch.set_rate(t, 1.0 / (1.0 + interference.comm_stretch) if computing else 1.0)
        rate = 1.0 - ch.compute_loss(t, interference)
    stuck = [prep.op_names[i] for i in range(n_ops) if finish[i] == _INF]
    if stuck:
        raise InputError(f"ops never become ready: {stuck[:5]}", field="ops")
    return JointResult(op_start_us=start, op_finish_us=finish, tensor_done_us=done_us)


def ideal_op_times(
    prep: TraceAnalysis, tensor_done_us: Sequence[float], gate_us: float | None
) -> tuple[list[float], list[float]]:
    """Op start/finish under ideal compute given tensor done times.

    ``gate_us``: under a barrier, the time every gated op waits for (end of communication).
    """
    n = len(prep.op_names)
    start = [0.0] * n
    finish = [0.0] * n
    deps = prep.deps
    consumes = prep.consumes
    dur = prep.duration_us
    gated = prep.gated
    for i in prep.topo:
        s = 0.0
        for j in deps[i]:
            s = max(s, finish[j])
        for k in consumes[i]:
            s = max(s, tensor_done_us[k])
        if gate_us is not None and gated[i] and gate_us > s:
            s = gate_us
        start[i] = s
        finish[i] = s + dur[i]
    return start, finish
