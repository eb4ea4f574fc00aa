"""A monitor cheap enough to stay on: per-iteration timings in preallocated ring buffers.

The runtime calls the ``on_*`` methods from its hooks; each is O(1) (a few list stores, no
allocation of per-event objects, no lock). ``snapshot`` builds an ``ObservedStats`` of the last
iterations when a re-estimation needs it (rare, O(window * tensors)).

Threading: gradient hooks (autograd thread), unit completions (dispatcher thread) and the
iteration boundary (training thread) may call from different threads. Each call is a handful of
list item stores, which the GIL makes atomic; an event that races an iteration boundary is
attributed to the iteration open when it is recorded, a harmless error for a median-based
estimate. ``snapshot`` must be called from the thread that calls ``on_iteration_end``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from pace.drift.estimate import IterationStats, ObservedStats
from pace.errors import InputError

__all__ = ["Monitor"]

_NAN = math.nan


class Monitor:
    """Ring buffers over the last ``capacity`` iterations.

    Times are in microseconds from any monotonic clock (e.g. ``time.perf_counter_ns() / 1e3``);
    only differences are used.

    >>> m = Monitor(["w1", "w0"], capacity=4)
    >>> m.on_iteration_start(0.0)
    >>> m.on_backward_start(0.0)
    >>> m.on_grad_ready("w1", 10.0)
    >>> m.on_grad_ready(1, 20.0)
    >>> m.on_backward_end(20.0)
    >>> m.on_unit_done(0, 400, 25.0)
    >>> m.on_forward_compute(9.0)
    >>> m.on_iteration_end(40.0)
    40.0
    >>> it = m.snapshot().iterations[-1]
    >>> (it.iteration, it.iteration_us, it.backward_us, it.forward_us, dict(it.grad_ready_us))
    (0, 40.0, 20.0, 9.0, {'w1': 10.0, 'w0': 20.0})
    >>> it.unit_samples
    ((400, 25.0),)
    """

    __slots__ = (
        "_bw_end",
        "_bw_start",
        "_cap",
        "_count",
        "_fw",
        "_index",
        "_iter_start",
        "_iter_us",
        "_iteration",
        "_names",
        "_ready",
        "_slot",
        "_unit_bytes",
        "_unit_dur",
        "trace_digest",
    )

    def __init__(
        self, tensor_names: Sequence[str], *, capacity: int = 64, trace_digest: str = ""
    ) -> None:
        if capacity < 1:
            raise InputError(f"must be >= 1, got {capacity!r}", field="capacity")
        self._names = tuple(tensor_names)
        self._index = {n: i for i, n in enumerate(self._names)}
        if len(self._index) != len(self._names):
            raise InputError("must be unique", field="tensor_names")
        # One slot more than the capacity: the open iteration's slot is not a completed one.
        slots = capacity + 1
        self._cap = slots
        n = len(self._names)
        self._ready = [[_NAN] * n for _ in range(slots)]
        self._iter_us = [_NAN] * slots
        self._bw_start = [_NAN] * slots
        self._bw_end = [_NAN] * slots
        self._fw = [_NAN] * slots
        self._iteration = [0] * slots
        # Unit samples per slot: plain lists; append is amortised O(1) and they are cleared
        # (not reallocated) when the slot is reused.
        self._unit_bytes: list[list[int]] = [[] for _ in range(slots)]
        self._unit_dur: list[list[float]] = [[] for _ in range(slots)]
        self._slot = 0
        self._count = 0  # completed iterations, ever
        self._iter_start = _NAN
        self.trace_digest = trace_digest

    # -- events (hot path) ------------------------------------------------------------------

    def on_iteration_start(self, t_us: float) -> None:
        """Start of an iteration (only needed for the first; ends start the next)."""
        self._iter_start = t_us

    def on_backward_start(self, t_us: float) -> None:
        self._bw_start[self._slot] = t_us

    def on_grad_ready(self, tensor: int | str, t_us: float) -> None:
        """Gradient ``tensor`` (index into ``tensor_names``, or its name) became ready."""
        i = tensor if isinstance(tensor, int) else self._index[tensor]
        self._ready[self._slot][i] = t_us

    def on_backward_end(self, t_us: float) -> None:
        self._bw_end[self._slot] = t_us

    def on_forward_compute(self, duration_us: float) -> None:
        """Forward compute time of this iteration (span minus time blocked on communication)."""
        self._fw[self._slot] = duration_us

    def on_unit_done(self, unit_index: int, size_bytes: int, duration_us: float) -> None:
        """All-reduce unit ``unit_index`` carried ``size_bytes`` and took ``duration_us``.

        ``unit_index`` is accepted for the runtime's convenience; the estimate needs only sizes.
        """
        s = self._slot
        self._unit_bytes[s].append(size_bytes)
        self._unit_dur[s].append(duration_us)

    def on_iteration_end(self, t_us: float) -> float:
        """Close the current iteration; returns its time (NaN for the very first call).

        The next iteration starts at ``t_us``. Clearing the next slot costs O(tensors), once per
        iteration, which is O(1) per gradient event.
        """
        s = self._slot
        dt = t_us - self._iter_start
        self._iter_us[s] = dt
        self._iteration[s] = self._count
        self._iter_start = t_us
        self._count += 1
        s = (s + 1) % self._cap
        self._slot = s
        row = self._ready[s]
        for i in range(len(row)):
            row[i] = _NAN
        self._bw_start[s] = _NAN
        self._bw_end[s] = _NAN
        self._fw[s] = _NAN
        self._unit_bytes[s].clear()
        self._unit_dur[s].clear()
        return dt

    # -- reading ----------------------------------------------------------------------------

    @property
    def iterations_seen(self) -> int:
        return self._count

    def snapshot(self, last: int | None = None) -> ObservedStats:
        """The last ``last`` (default: all buffered) completed iterations, oldest first.

        Iterations whose time is unknown (no start recorded) are left out.
        """
        n = min(self._count, self._cap - 1)
        if last is not None:
            n = min(n, max(last, 0))
        out: list[IterationStats] = []
        for k in range(n, 0, -1):
            s = (self._slot - k) % self._cap
            it_us = self._iter_us[s]
            if not math.isfinite(it_us) or it_us < 0:
                continue
            bw0 = self._bw_start[s]
            bw1 = self._bw_end[s]
            ready: dict[str, float] = {}
            if math.isfinite(bw0):
                for name, t in zip(self._names, self._ready[s], strict=True):
                    if math.isfinite(t):
                        ready[name] = max(t - bw0, 0.0)
            bw_us = bw1 - bw0 if math.isfinite(bw0) and math.isfinite(bw1) else None
            fw = self._fw[s]
            out.append(
                IterationStats(
                    iteration=self._iteration[s],
                    iteration_us=it_us,
                    backward_us=bw_us if bw_us is not None and bw_us >= 0 else None,
                    forward_us=fw if math.isfinite(fw) and fw >= 0 else None,
                    grad_ready_us=ready,
                    unit_samples=tuple(zip(self._unit_bytes[s], self._unit_dur[s], strict=False)),
                )
            )
        return ObservedStats(iterations=tuple(out), trace_digest=self.trace_digest)

    def dump(self, path: str) -> None:
        """Write the buffered iterations as ``stats.json`` for ``pace recompile --observed``."""
        self.snapshot().dump(path)
