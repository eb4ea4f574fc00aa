"""Event loops and communication channels of the simulator.

A *channel* models the all-reduce engine: it is told when tensors are produced and reports
when tensors are done. Three channels exist:

* :class:`StaticChannel` replays a fixed list of units by priority with ``credit`` units in
  flight sharing the bandwidth equally (processor sharing; ``credit=1`` is the contract's
  one-at-a-time channel).
* :class:`CycleFusionChannel` is Horovod's background thread: every cycle it fuses the tensors
  produced so far into units up to the fusion threshold and runs them back to back.
* :func:`shared_static_replay` is the fast path of ``StaticChannel`` with a credit / byte window
  (processor sharing in virtual time) under ideal compute, where tensor release times are known
  in advance (Lemma 1). With credit 1 the fast path is the contract's own kernel,
  :func:`pace.replay.serial_replay`.

The drivers that run them are in ``pace.sim.drivers``.
"""

from __future__ import annotations

import heapq
import math
from abc import ABC, abstractmethod

from pace.analysis import TraceAnalysis
from pace.ir import Interference, Slice, Unit
from pace.replay import UnitArrays

_INF = math.inf


def shared_static_replay(
    cu: UnitArrays, credit: int | None, credit_bytes: int | None = None
) -> tuple[list[float], list[float]]:
    """Unit start/finish times with up to ``credit`` units sharing the channel equally.

    ``credit_bytes``: ByteScheduler's byte window: another unit may start only while the bytes
    in flight are below it (the unit that crosses it still starts). ``None``: no such limit;
    ``credit=None``: no limit on the unit count.

    Fixed release times (ideal compute). Processor sharing is tracked in *virtual time*: with
    ``n`` units in flight, virtual time advances at ``1/n`` of real time, and a unit started at
    virtual time ``v`` finishes when virtual time reaches ``v + cost``; so every event costs a
    heap operation instead of a pass over the units in flight.
    """
    n = len(cu.units)
    ready = cu.ready_us
    prio = cu.priority
    cost = cu.cost_us
    size = cu.size_bytes
    order = sorted(range(n), key=ready.__getitem__)
    start = [0.0] * n
    finish = [0.0] * n
    max_units = credit if credit is not None else n + 1
    max_bytes = credit_bytes if credit_bytes is not None else math.inf
    in_flight_bytes = 0
    waiting: list[tuple[float, int]] = []
    flight: list[tuple[float, int]] = []  # (virtual finish, unit)
    push = heapq.heappush
    pop = heapq.heappop
    t = 0.0
    v = 0.0
    i = 0
    while True:
        while i < n and ready[order[i]] <= t:
            u = order[i]
            push(waiting, (prio[u], u))
            i += 1
        while waiting and len(flight) < max_units and in_flight_bytes < max_bytes:
            u = pop(waiting)[1]
            start[u] = t
            in_flight_bytes += size[u]
            push(flight, (v + cost[u], u))
        t_release = ready[order[i]] if i < n else _INF
        k = len(flight)
        t_finish = t + (flight[0][0] - v) * k if k else _INF
        if t_finish == _INF and t_release == _INF:
            break
        if t_release < t_finish:
            if k:
                v += (t_release - t) / k
            t = t_release
            continue
        # A finish (possibly together with a release, which the next pass picks up).
        v = flight[0][0]
        t = t_finish
        while flight and flight[0][0] <= v:
            u = pop(flight)[1]
            finish[u] = t
            in_flight_bytes -= size[u]
    return start, finish


class Channel(ABC):
    """The all-reduce engine as seen by the event loops."""

    @abstractmethod
    def produce(self, tensor: int, now: float) -> None:
        """Tensor ``tensor`` was produced at ``now``."""

    @abstractmethod
    def next_time(self) -> float:
        """Time of the next internal event (a unit finishing, a cycle tick), or inf."""

    @abstractmethod
    def advance(self, now: float) -> list[int]:
        """Process internal events due at ``now``; return the tensors that became done."""

    @abstractmethod
    def dispatch(self, now: float) -> None:
        """Start whatever may start at ``now`` (after every event at ``now`` was processed)."""

    @abstractmethod
    def records(self) -> tuple[tuple[Unit, ...], list[float], list[float]]:
        """The units replayed (file order) with their start and finish times."""

    def copy_us(self) -> float:
        """The runtime's copy-back of the units the last ``advance`` finished
        (``UnitArrays.copy_us``); a framework's own calls copy inside their cost: 0."""
        return 0.0

    @abstractmethod
    def compute_loss(self, now: float, interference: Interference) -> float:
        """Fraction of compute progress lost at ``now`` (after the events at ``now``)."""

    @abstractmethod
    def set_rate(self, now: float, rate: float) -> None:
        """From ``now`` on, calls progress at ``rate`` of their full speed."""

    call_extra_us: float


class StaticChannel(Channel):
    """Fixed units; ``credit`` of them in flight share the bandwidth equally.

    A unit's cost is its duration alone on the channel; with ``n`` units in flight each
    progresses at rate ``1/n`` (processor sharing), so total throughput never exceeds one
    channel's.
    """

    def __init__(
        self,
        cu: UnitArrays,
        credit: int | None,
        credit_bytes: int | None = None,
        *,
        queued: bool = False,
    ) -> None:
        self.cu = cu
        # Queued: the units in flight cross the channel one at a time in issue order (an
        # in-order backend); the credit bounds how far ahead units are committed to it.
        self.queued = queued
        self.credit = credit if credit is not None else len(cu.units) + 1
        self.credit_bytes = credit_bytes if credit_bytes is not None else math.inf
        self.flight_bytes = 0
        n = len(cu.units)
        self.missing = [len(ts) for ts in cu.tensors]
        self.left_units = [len(us) for us in cu.units_of_tensor]
        self.heap: list[tuple[float, int]] = []
        self.next_in_order = 0
        # In-flight units and the work (in us at full rate) each still has to do.
        self.flight: list[int] = []
        self.remaining: list[float] = []
        self.last = 0.0
        self.rate = 1.0
        # Extra work (us at full speed) of a call issued now: set by the driver (interference).
        self.call_extra_us = 0.0
        # Per unit, its whole work at full rate once issued: its cost plus the extra it was
        # issued with. A call's compute loss is spread over all of it (``compute_loss``).
        self.work = [0.0] * n
        self.start = [_INF] * n
        self.finish = [_INF] * n
        self.finished_copy_us = 0.0

    def produce(self, tensor: int, now: float) -> None:
        for u in self.cu.units_of_tensor[tensor]:
            self.missing[u] -= 1
            if self.missing[u] == 0 and not self.cu.in_order:
                heapq.heappush(self.heap, (self.cu.priority[u], u))
        if self.cu.in_order:
            order = self.cu.priority_order
            while self.next_in_order < len(order) and self.missing[order[self.next_in_order]] == 0:
                u = order[self.next_in_order]
                heapq.heappush(self.heap, (self.cu.priority[u], u))
                self.next_in_order += 1

    def next_time(self) -> float:
        if not self.flight:
            return _INF
        if len(self.flight) == 1 or self.queued:
            return self.last + self.remaining[0] / self.rate
        return self.last + min(self.remaining) * len(self.flight) / self.rate

    def _progress(self, now: float) -> None:
        n = len(self.flight)
        if n and now > self.last:
            if self.queued:
                self.remaining[0] -= (now - self.last) * self.rate
            else:
                dt = (now - self.last) * self.rate / n
                self.remaining = [r - dt for r in self.remaining]
        self.last = now

    def set_rate(self, now: float, rate: float) -> None:
        if rate != self.rate:
            self._progress(now)
            self.rate = rate

    def advance(self, now: float) -> list[int]:
        self.finished_copy_us = 0.0
        if not self.flight:
            return []
        if len(self.flight) == 1 or self.queued:
            if now < self.last + self.remaining[0] / self.rate:
                return []
            done_units = [self.flight[0]]
            self.flight = self.flight[1:]
            self.remaining = self.remaining[1:]
            self.last = now
            if self.flight:  # the next queued unit goes on the wire now
                self.start[self.flight[0]] = now
        else:
            self._progress(now)
            done_units = []
            keep_u: list[int] = []
            keep_r: list[float] = []
            for u, r in zip(self.flight, self.remaining, strict=True):
                # Relative tolerance: processor sharing accumulates rounding in `remaining`.
                if r <= 1e-9 * max(1.0, self.cu.cost_us[u]):
                    done_units.append(u)
                else:
                    keep_u.append(u)
                    keep_r.append(r)
            self.flight = keep_u
            self.remaining = keep_r
        done: list[int] = []
        copy = self.cu.copy_us
        for u in done_units:
            if copy:
                self.finished_copy_us += copy[u]
            self.finish[u] = now
            self.flight_bytes -= self.cu.size_bytes[u]
            for k in self.cu.tensors[u]:
                self.left_units[k] -= 1
                if self.left_units[k] == 0:
                    done.append(k)
        return done

    def dispatch(self, now: float) -> None:
        if len(self.flight) >= self.credit or self.flight_bytes >= self.credit_bytes:
            return
        if not self.heap:
            return
        self._progress(now)
        while (
            self.heap and len(self.flight) < self.credit and self.flight_bytes < self.credit_bytes
        ):
            u = heapq.heappop(self.heap)[1]
            self.flight_bytes += self.cu.size_bytes[u]
            if not (self.queued and self.flight):  # else it starts when it reaches the head
                self.start[u] = now
            self.flight.append(u)
            self.work[u] = self.cu.cost_us[u] + self.call_extra_us
            self.remaining.append(self.work[u])

    def records(self) -> tuple[tuple[Unit, ...], list[float], list[float]]:
        return self.cu.units, self.start, self.finish

    def copy_us(self) -> float:
        return self.finished_copy_us

    def compute_loss(self, now: float, interference: Interference) -> float:
        # Units sharing the channel move its bytes at the one channel's rate, each at 1/n of
        # it and slowed by the rate: each takes n / rate times its work. The work includes the
        # extra a call issued beside compute takes (``comm_us_per_call``): the loss the probe
        # measured per call is spread over the call's whole time, as Horovod's channel does.
        if self.queued:
            on_wire = self.flight[:1]
            stretch = 1.0 / self.rate
        else:
            on_wire = self.flight
            stretch = len(self.flight) / self.rate
        return interference.compute_loss(
            (self.cu.size_bytes[u], self.work[u] * stretch) for u in on_wire
        )


class AgreedReadinessChannel(StaticChannel):
    """A :class:`StaticChannel` whose gradients count as ready only once every rank knows it
    (pace's online runtime, ``SimOptions.agreed_readiness``).

    Each call carries the gradients produced when it was issued; they become known when it
    completes. When nothing known is left to send and no call is in flight, a readiness probe
    of ``probe_us`` runs first (one more call, carrying only the flags). The ranks are
    symmetric in the simulator, so "ready on every rank" is "produced".
    """

    def __init__(
        self,
        cu: UnitArrays,
        credit: int | None,
        credit_bytes: int | None,
        *,
        queued: bool = False,
        probe_us: float,
    ) -> None:
        super().__init__(cu, credit, credit_bytes, queued=queued)
        self.probe_us = probe_us
        self.produced: list[int] = []  # tensors in the order they were produced
        self.known = 0  # produced[:known] are known on every rank
        self.carried = [0] * len(cu.units)  # produced[:carried[u]] ride on unit u
        self.probe_end = _INF
        self.probe_carries = 0

    def produce(self, tensor: int, now: float) -> None:
        self.produced.append(tensor)

    def _learn(self, upto: int, now: float) -> None:
        while self.known < upto:
            super().produce(self.produced[self.known], now)
            self.known += 1

    def next_time(self) -> float:
        return min(super().next_time(), self.probe_end)

    def advance(self, now: float) -> list[int]:
        if self.probe_end <= now:
            self.probe_end = _INF
            self._learn(self.probe_carries, now)
        before = set(self.flight)
        done = super().advance(now)
        for u in before.difference(self.flight):
            self._learn(self.carried[u], now)
        return done

    def dispatch(self, now: float) -> None:
        flying = set(self.flight)
        super().dispatch(now)
        for u in self.flight:
            if u not in flying:
                self.carried[u] = len(self.produced)
        if (
            not self.flight
            and not self.heap
            and self.probe_end == _INF
            and self.known < len(self.produced)
        ):
            self.probe_carries = len(self.produced)
            self.probe_end = now + (self.probe_us + self.call_extra_us) / self.rate


class CycleFusionChannel(Channel):
    """Horovod's background thread: cycle-time tensor fusion.

    The thread wakes at cycle boundaries. At a tick it takes every tensor produced so far and not
    yet sent, in the order they were produced, cuts that list greedily into fused units of at most
    ``threshold_bytes`` (a tensor larger than the threshold goes alone; ``threshold_bytes = 0``
    disables fusion) and all-reduces them back to back. The next tick is one cycle after this one
    or when the last unit finishes, whichever is later (``synchronous``: the thread blocks on
    its collectives, as in CPU/Gloo builds). With ``synchronous=False`` (GPU/NCCL builds, where
    the collectives are queued on a stream) the thread ticks every cycle regardless, and the
    units it forms queue behind the ones still running. The thread's phase relative to the
    backward pass is arbitrary in reality; here the tick grid is anchored at the first tensor's
    production (the phase most favourable to Horovod), so the model never overstates its delay.
    A tick's tensors are negotiated together: its first unit costs ``comm.cost_us`` plus the
    delay of a call issued beside compute (``call_extra_us``), every further one
    ``comm.batched_cost_us`` alone (the same as the first where the batched cost was not
    measured).
    """

    def __init__(
        self,
        prep: TraceAnalysis,
        *,
        threshold_bytes: int,
        cycle_us: float,
        synchronous: bool = True,
    ) -> None:
        self.prep = prep
        self.threshold = threshold_bytes
        self.cycle = cycle_us
        self.synchronous = synchronous
        self.channel_free = 0.0
        self.rate = 1.0
        self.call_extra_us = 0.0  # see StaticChannel
        self.comm = prep.trace.comm
        self.pending: list[int] = []
        # The earliest time the thread may run its next tick, and the grid it sleeps on
        # (None until the first tensor is produced).
        self.anchor: float | None = None
        self.tick: float = _INF
        # Units formed so far, (finish, unit index) in time order; those before batch_pos are done.
        self.batch: list[tuple[float, int]] = []
        self.batch_pos = 0
        self.units: list[Unit] = []
        self.unit_tensors: list[list[int]] = []
        self.start: list[float] = []
        self.finish: list[float] = []
        self.nbytes: list[int] = []
        self.cost: list[float] = []

    def _grid_tick(self, now: float) -> float:
        if self.anchor is None:
            self.anchor = now
        if now <= self.anchor:
            return self.anchor
        if self.cycle <= 0:
            return now
        steps = math.ceil((now - self.anchor) / self.cycle)
        t = self.anchor + steps * self.cycle
        # ceil of a rounded quotient can land one step short.
        return t if t >= now else t + self.cycle

    def _busy(self) -> bool:
        return self.synchronous and self.batch_pos < len(self.batch)

    def produce(self, tensor: int, now: float) -> None:
        self.pending.append(tensor)
        if self.tick == _INF and not self._busy():
            self.tick = self._grid_tick(now)

    def next_time(self) -> float:
        t = self.tick
        if self.batch_pos < len(self.batch):
            f = self.batch[self.batch_pos][0]
            t = min(t, f)
        return t

    def advance(self, now: float) -> list[int]:
        done: list[int] = []
        while self.batch_pos < len(self.batch) and self.batch[self.batch_pos][0] <= now:
            u = self.batch[self.batch_pos][1]
            done.extend(self.unit_tensors[u])
            self.batch_pos += 1
        return done

    def dispatch(self, now: float) -> None:
        if self.tick > now or self._busy():
            return
        size = self.prep.size_bytes
        groups: list[list[int]] = []
        current: list[int] = []
        current_bytes = 0
        for k in self.pending:
            b = size[k]
            if current and current_bytes + b > self.threshold:
                groups.append(current)
                current = []
                current_bytes = 0
            current.append(k)
            current_bytes += b
        if current:
            groups.append(current)
        self.pending = []
        t = max(now, self.channel_free)
        names = self.prep.tensor_names
        for i, g in enumerate(groups):
            nbytes = sum(size[k] for k in g)
            u = len(self.units)
            self.units.append(
                Unit(
                    priority=float(u),
                    slices=tuple(
                        Slice(tensor=names[k], offset_bytes=0, size_bytes=size[k]) for k in g
                    ),
                )
            )
            self.unit_tensors.append(g)
            self.start.append(t)
            # One negotiation per tick: its first call pays it, the rest only their share
            # (``CommModel.batched_alpha_us``). The delay of a call issued beside compute (the
            # thread waiting for a core to wake and negotiate) is the tick's too: its calls
            # then run back to back on the thread that already holds one.
            cost = (self.comm.batched_cost_us if i else self.comm.cost_us)(nbytes)
            self.nbytes.append(nbytes)
            self.cost.append(cost + (0.0 if i else self.call_extra_us))
            t = t + self.cost[-1] / self.rate
            self.finish.append(t)
            self.batch.append((t, u))
        self.channel_free = t
        # Next possible tick: one cycle after this one (and, if the thread blocks on its
        # collectives, no earlier than the end of this batch).
        self.anchor = max(now + self.cycle, t) if self.synchronous else now + self.cycle
        self.tick = _INF

    def after_batch(self, now: float) -> None:
        """Schedule the next tick if tensors are waiting once the batch drained."""
        if not self._busy() and self.pending and self.tick == _INF:
            self.tick = self._grid_tick(now)

    def records(self) -> tuple[tuple[Unit, ...], list[float], list[float]]:
        return tuple(self.units), self.start, self.finish

    def compute_loss(self, now: float, interference: Interference) -> float:
        # Units run back to back; the one on the wire is the first unfinished one, once started.
        if self.batch_pos < len(self.batch):
            u = self.batch[self.batch_pos][1]
            if self.start[u] <= now:
                return interference.compute_loss([(self.nbytes[u], self.cost[u] / self.rate)])
        return interference.compute_loss()

    def set_rate(self, now: float, rate: float) -> None:
        """Re-time the units not finished yet: the one on the wire keeps the work it has left,
        the queued ones follow back to back."""
        if rate == self.rate:
            return
        old, self.rate = self.rate, rate
        t = now
        for pos in range(self.batch_pos, len(self.batch)):
            u = self.batch[pos][1]
            if self.start[u] < now:
                self.finish[u] = now + (self.finish[u] - now) * old / rate
            else:  # formed at a tick no later than now: it starts when the channel frees
                self.start[u] = t
                self.finish[u] = t + self.cost[u] / rate
            t = self.finish[u]
            self.batch[pos] = (t, u)
        if self.batch_pos < len(self.batch):
            self.channel_free = t
