"""The replay engine: readiness marks, one dispatcher thread, one completion thread.

Threads and who touches what:

* the training thread (autograd hooks, ``step``, ``zero_grad``, forward pre-hooks) only marks
  gradients ready, closes iterations and waits for parameter updates;
* the dispatcher thread issues collectives, in the plan's order (replay) or in ByteScheduler's
  priority order decided from globally agreed readiness (online);
* the completion thread waits for collectives in issue order, copies fused buffers back, and
  runs the optimizer update of each parameter whose gradient is complete.

Shared counters live under one condition variable. Per parameter ``i``: ``marks[i]`` = iterations
whose gradient was marked ready, ``updated[i]`` = iterations whose update is applied, and
``steps`` = iterations closed by ``step()``. Invariants: ``updated[i] <= marks[i] <= steps + 1``.

Every wait of the training thread has a time limit; the background threads turn any failure
(time-out, a dead peer, a bug) into one ``RuntimeReplayError`` that the training thread raises
at its next call into the runtime.
"""

from __future__ import annotations

import heapq
import queue
import random
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import torch

from pace.errors import RuntimeReplayError
from pace.runtime.backends import Backend, CollectiveTimeoutError
from pace.runtime.plan import ParamInfo, PlanUnit, ReplayPlan

Mode = Literal["replay", "online"]
# Called with (parameter indices whose gradient is fully reduced, iteration).
Updater = Callable[[tuple[int, ...], int], None]


@dataclass(kw_only=True, slots=True)
class _Flight:
    """One issued collective, from the dispatcher to the completion thread."""

    iteration: int
    unit: PlanUnit | None  # None: an online readiness probe
    buf: torch.Tensor
    handle: Any
    copy_back: list[tuple[torch.Tensor, int, int]]  # (gradient view, start, stop in buf)
    nbytes: int
    bitmap_at: int  # offset of the readiness bitmap in buf; -1 if none
    plan: ReplayPlan
    issued_s: float
    done: threading.Event = field(default_factory=threading.Event)
    agreed: list[bool] | None = None


class Engine:
    """Replays a plan for one model; see the module docstring for the threading contract."""

    def __init__(
        self,
        *,
        params: Sequence[torch.nn.Parameter],
        infos: Sequence[ParamInfo],
        plan: ReplayPlan,
        backend: Backend,
        mode: Mode,
        updater: Updater,
        on_iteration_start: Callable[[int], None],
        credit_bytes: int,
        timeout_s: float,
        inject_delay_s: float = 0.0,
        seed: int = 0,
        monitor: Any = None,
    ) -> None:
        self.params = list(params)
        self.infos = list(infos)
        self.plan = plan
        # Schedule switches: (first iteration, plan), applied by the dispatcher at that boundary.
        self._switches: list[tuple[int, ReplayPlan]] = []
        self._monitor = monitor
        self._last_done_s = 0.0
        self.backend = backend
        self.mode = mode
        self._updater = updater
        self._on_iteration_start = on_iteration_start
        self.credit_bytes = credit_bytes
        self.timeout_s = timeout_s
        self._delay_s = inject_delay_s
        self._seed = seed
        n = len(self.params)
        self._cv = threading.Condition()
        self.marks = [0] * n
        self.updated = [0] * n
        self.steps = 0
        self._marked_in_iteration = 0
        self._pending_zero: list[bool | None] = [None] * n
        # (parameter, iteration) -> pieces still in flight; keyed by iteration so a schedule
        # switch never mixes the piece counts of two plans.
        self._remaining: dict[tuple[int, int], int] = {}
        self._in_flight_bytes = 0
        self._error: RuntimeReplayError | None = None
        self._stop = False
        self._closed = False
        # Where the dispatcher is, for time-out messages (written by the dispatcher only).
        self._dispatch_at = "not started"
        self._oldest_flight = ""
        self._queue: queue.SimpleQueue[_Flight | None] = queue.SimpleQueue()
        self._fused: dict[int, torch.Tensor] = {}
        self._ready_rng = random.Random(f"{seed}:hook:{backend.rank}")
        self._threads = [
            threading.Thread(target=self._guard(self._dispatch_loop), name="pace-dispatch"),
            threading.Thread(target=self._guard(self._complete_loop), name="pace-complete"),
        ]
        for t in self._threads:
            # Daemon only so a collective stuck inside C++ can never block interpreter exit;
            # close() joins them.
            t.daemon = True
            t.start()

    # -----------------------------------------------------------------------------------------
    # Training-thread side

    def mark_ready(self, i: int) -> None:
        """Autograd hook: parameter ``i``'s gradient for the current iteration is final."""
        self._raise_if_failed()
        self._chaos(self._ready_rng)
        p = self.params[i]
        grad = p.grad
        if grad is None:  # pragma: no cover - autograd always sets it before this hook
            return
        if grad.is_sparse:
            raise RuntimeReplayError(
                f"parameter {self.infos[i].name!r}: sparse gradients are not supported"
            )
        if not grad.is_contiguous():
            # The schedule's byte offsets refer to the row-major flattened gradient.
            p.grad = grad.contiguous()
        with self._cv:
            k = self.steps
            if self.marks[i] != k:
                raise RuntimeReplayError(
                    f"rank {self.backend.rank}: gradient of {self.infos[i].name!r} computed twice "
                    f"in iteration {k}; call step() after every backward() (gradient "
                    "accumulation over several backward passes is not supported)"
                )
            if self.updated[i] < k:
                raise RuntimeReplayError(
                    f"rank {self.backend.rank}: gradient of {self.infos[i].name!r} for iteration "
                    f"{k} arrived before its update of iteration {k - 1} finished: the parameter "
                    "is used outside the forward of the module that owns it; call "
                    "synchronize() before such uses"
                )
            if self._marked_in_iteration == 0:
                self._on_iteration_start(k)
            self._marked_in_iteration += 1
            self.marks[i] = k + 1
            self._cv.notify_all()
        if self._monitor is not None:
            self._monitor.on_grad_ready(i, time.perf_counter() * 1e6)

    def switch_plan(self, plan: ReplayPlan) -> int:
        """Replay ``plan`` from the next iteration on; returns that iteration's number.

        Call on every rank at the same iteration boundary (between ``step()`` and the next
        backward), e.g. when ``pace.drift``'s switch protocol says so: the iteration number is
        then the same everywhere and so is the order of every later collective.
        """
        if self.mode != "replay":
            raise RuntimeReplayError("the online mode has no schedule to switch")
        with self._cv:
            if self._marked_in_iteration:
                raise RuntimeReplayError(
                    "switch the schedule between step() and the next backward(), not during one"
                )
            at = self.steps
            self._switches.append((at, plan))
            self._cv.notify_all()
        return at

    def _plan_for(self, k: int) -> ReplayPlan:
        with self._cv:
            while self._switches and self._switches[0][0] <= k:
                self.plan = self._switches.pop(0)[1]
            return self.plan

    def close_iteration(self) -> None:
        """``step()``: every gradient not marked yet is final now (zeros if never computed)."""
        self._raise_if_failed()
        with self._cv:
            k = self.steps
            started = self._marked_in_iteration > 0
            todo = [i for i, m in enumerate(self.marks) if m == k]
            # Re-reducing a gradient whose previous reduction is still in flight would race on
            # the same memory (step() twice without a forward in between).
            self._wait_locked(lambda: all(self.updated[i] >= k for i in todo), "step()", todo)
            if not started:
                self._on_iteration_start(k)
            for i in todo:
                p = self.params[i]
                if p.grad is None:
                    # Horovod's DistributedOptimizer does the same: another rank may have a
                    # gradient for it, and every rank must issue the same collectives.
                    p.grad = torch.zeros_like(p, memory_format=torch.contiguous_format)
                elif not p.grad.is_contiguous():
                    p.grad = p.grad.contiguous()
                self.marks[i] = k + 1
            self._marked_in_iteration = 0
            self.steps = k + 1
            self._cv.notify_all()

    def wait_updated(self, indices: Sequence[int], what: str) -> None:
        """Block until the parameters ``indices`` carry the update of every closed iteration."""
        steps = self.steps
        updated = self.updated
        if self._marked_in_iteration and any(self.marks[i] > steps for i in indices):
            # These gradients are final and their parameters are being updated in place right
            # now; a forward (and its backward) would see a half-updated model. (A forward whose
            # parameters have no gradient yet, e.g. activation checkpointing's recompute, is fine.)
            raise RuntimeReplayError(
                f"rank {self.backend.rank}: {what} between backward() and step(): its parameters "
                "are already being updated (gradient accumulation over several forward/backward "
                "passes is not supported); call step() first"
            )
        if self._error is None and all(updated[i] >= steps for i in indices):
            return
        with self._cv:
            self._wait_locked(
                lambda: all(self.updated[i] >= self.steps for i in indices), what, indices
            )

    def iteration_open(self) -> bool:
        """True between the first gradient of an iteration and its step()."""
        return self._marked_in_iteration > 0

    def zero_grad(self, set_to_none: bool) -> None:
        """Zero now where the update is done, else right after the update (before it is visible)."""
        self._raise_if_failed()
        with self._cv:
            if self.iteration_open():
                raise RuntimeReplayError(
                    "zero_grad() was called after backward() but before step(): the gradients "
                    "are being reduced; call step() first"
                )
            for i, p in enumerate(self.params):
                if self.updated[i] >= self.steps:
                    zero_param_grad(p, set_to_none)
                else:
                    self._pending_zero[i] = set_to_none

    def synchronize(self) -> None:
        self._raise_if_failed()
        if self.iteration_open():
            raise RuntimeReplayError(
                "synchronize() was called between backward() and step(): the runtime applies "
                "each update as soon as its gradient is reduced, so there is nothing to "
                "synchronize before step() (gradient clipping between backward and step is not "
                "supported in replay)"
            )
        self.wait_updated(range(len(self.params)), "synchronize()")

    def close(self) -> None:
        """Stop both threads and wait for them (clean shutdown; idempotent)."""
        if self._closed:
            return
        self._closed = True
        with self._cv:
            self._stop = True
            self._cv.notify_all()
        self._queue.put(None)
        for t in self._threads:
            if t is not threading.current_thread():
                # A collective can block at most timeout_s in the completion thread.
                t.join(self.timeout_s + 5.0)
        self.backend.close()

    # -----------------------------------------------------------------------------------------
    # Errors and waiting

    def _raise_if_failed(self) -> None:
        err = self._error
        if err is not None:
            raise RuntimeReplayError(str(err)) from err

    def _fail(self, message: str, cause: BaseException | None = None) -> None:
        with self._cv:
            if self._error is None:
                err = RuntimeReplayError(message)
                err.__cause__ = cause
                self._error = err
            self._stop = True
            self._cv.notify_all()
        self._queue.put(None)

    def _wait_locked(self, pred: Callable[[], bool], what: str, indices: Sequence[int]) -> None:
        # Twice the collective limit: a stuck collective is reported first, by the completion
        # thread, with the exact unit; this catches everything else (e.g. a dead dispatcher).
        limit_s = 2 * self.timeout_s
        deadline = time.monotonic() + limit_s
        while not pred():
            self._raise_if_failed()
            left = deadline - time.monotonic()
            if left <= 0:
                waiting = [self.infos[i].name for i in indices if self.updated[i] < self.steps]
                msg = (
                    f"rank {self.backend.rank}: {what} timed out after {limit_s:g} s "
                    f"waiting for the update of {waiting[:3]} (iteration {self.steps - 1}); "
                    f"dispatcher at {self._dispatch_at}; oldest in flight: "
                    f"{self._oldest_flight or 'none'}"
                )
                self._error = RuntimeReplayError(msg)
                self._stop = True
                self._cv.notify_all()
                raise RuntimeReplayError(msg)
            self._cv.wait(left)
        self._raise_if_failed()

    def _guard(self, body: Callable[[], None]) -> Callable[[], None]:
        def run() -> None:
            try:
                body()
            except _StoppedError:
                pass
            except BaseException as exc:  # any failure must reach the trainer
                self._fail(f"rank {self.backend.rank}: runtime thread failed: {exc!r}", exc)

        return run

    def _chaos(self, rng: random.Random) -> None:
        if self._delay_s > 0:
            time.sleep(rng.uniform(0.0, self._delay_s))

    # -----------------------------------------------------------------------------------------
    # Dispatcher

    def _wait_marked(self, params: Sequence[int], k: int) -> None:
        with self._cv:
            while not all(self.marks[i] > k for i in params):
                if self._stop:
                    raise _StoppedError
                self._cv.wait()
            if self._stop:
                raise _StoppedError

    def _wait_any_marked(self, k: int) -> None:
        with self._cv:
            # Iteration k has begun: closed, or current (steps == k) with a gradient marked.
            # (A mark counted while steps < k belongs to an earlier iteration.)
            while not (self.steps > k or (self.steps == k and self._marked_in_iteration)):
                if self._stop:
                    raise _StoppedError
                self._cv.wait()

    def _wait_credit(self, nbytes: int) -> None:
        with self._cv:
            while self._in_flight_bytes > 0 and self._in_flight_bytes + nbytes > self.credit_bytes:
                if self._stop:
                    raise _StoppedError
                self._cv.wait()
            self._in_flight_bytes += nbytes

    def _pack(self, unit: PlanUnit, bitmap_len: int) -> tuple[torch.Tensor, list[Any], int]:
        views = []
        for piece in unit.pieces:
            grad = self.params[piece.param].grad
            assert grad is not None  # marked ready => set (close_iteration fills None)
            flat = grad.view(-1)
            views.append(
                flat
                if piece.start == 0 and piece.stop == flat.numel()
                else flat[piece.start : piece.stop]
            )
        if len(views) == 1 and bitmap_len == 0:
            # A single piece is reduced in place: no copy at all.
            return views[0], [], -1
        buf = self._fused.get(unit.index)
        numel = unit.numel + bitmap_len
        if buf is None or buf.dtype != views[0].dtype:
            buf = torch.empty(numel, dtype=views[0].dtype)
            self._fused[unit.index] = buf
        copy_back = []
        at = 0
        for v in views:
            n = v.numel()
            buf[at : at + n].copy_(v)
            copy_back.append((v, at, at + n))
            at += n
        return buf, copy_back, (at if bitmap_len else -1)

    def _issue(
        self, k: int, unit: PlanUnit | None, name: str, *, plan: ReplayPlan, bitmap_len: int = 0
    ) -> _Flight:
        if unit is None:
            buf = torch.empty(bitmap_len, dtype=torch.float32)
            copy_back: list[Any] = []
            bitmap_at = 0
        else:
            buf, copy_back, bitmap_at = self._pack(unit, bitmap_len)
        if bitmap_at >= 0:
            # Which gradients are ready here, now; the average over ranks is 1 only for the
            # gradients ready on every rank, which every rank then learns identically.
            marks = self.marks
            buf[bitmap_at:] = torch.tensor([1.0 if m > k else 0.0 for m in marks], dtype=buf.dtype)
        nbytes = buf.numel() * buf.element_size()
        flight = _Flight(
            iteration=k,
            unit=unit,
            buf=buf,
            handle=self.backend.start(buf, name),
            copy_back=copy_back,
            nbytes=nbytes,
            bitmap_at=bitmap_at,
            plan=plan,
            issued_s=time.perf_counter(),
        )
        self._queue.put(flight)
        return flight

    def _dispatch_loop(self) -> None:
        rng = random.Random(f"{self._seed}:dispatch:{self.backend.rank}")
        k = 0
        while True:
            if self.mode == "replay":
                self._replay_iteration(k, rng)
            else:
                self._online_iteration(k, rng)
            k += 1

    def _replay_iteration(self, k: int, rng: random.Random) -> None:
        # The first mark of iteration k happens after the switch point of k: waiting for it
        # first makes a switch requested at this boundary visible here.
        self._wait_any_marked(k)
        plan = self._plan_for(k)
        for unit in plan.units:
            where = f"{plan.describe(unit.index, self.infos)} of iteration {k}"
            self._dispatch_at = f"{where} (waiting for gradients)"
            self._wait_marked(unit.params, k)
            self._chaos(rng)
            nbytes = unit.numel * _itemsize(self.infos[unit.pieces[0].param])
            self._dispatch_at = f"{where} (waiting for credit)"
            self._wait_credit(nbytes)
            self._issue(k, unit, f"pace.{unit.index}", plan=plan)
        self._dispatch_at = f"end of iteration {k}"

    def _online_iteration(self, k: int, rng: random.Random) -> None:
        """ByteScheduler's Alg. 1 with a deterministic order on every rank.

        A partition may be sent only once its tensor is known ready on *every* rank; that
        knowledge travels inside the collectives themselves (a readiness bitmap appended to
        each buffer), and the dispatcher folds it in only at points that are the same on every
        rank (when it is blocked on credit, oldest flight first). So each rank computes the same
        sequence of decisions without any extra negotiation round, and the highest-priority
        known-ready partition always goes next (preemption at partition granularity).
        """
        n_params = len(self.params)
        units_of: list[list[PlanUnit]] = [[] for _ in range(n_params)]
        for u in self.plan.units:
            units_of[u.pieces[0].param].append(u)
        known = [False] * n_params
        heap: list[tuple[float, int]] = []
        flights: deque[_Flight] = deque()
        in_flight = 0
        sent = 0

        def fold(f: _Flight) -> None:
            nonlocal in_flight
            self._wait_done(f)
            in_flight -= f.nbytes
            assert f.agreed is not None
            for j, ok in enumerate(f.agreed):
                if ok and not known[j]:
                    known[j] = True
                    for u in units_of[j]:
                        heapq.heappush(heap, (u.priority, u.index))

        while sent < len(self.plan.units):
            if heap:
                unit = self.plan.units[heap[0][1]]
                nbytes = (unit.numel + n_params) * _itemsize(self.infos[unit.pieces[0].param])
                if not flights or in_flight + nbytes <= self.credit_bytes:
                    heapq.heappop(heap)
                    self._dispatch_at = f"{self._describe(unit)} of iteration {k}"
                    self._chaos(rng)
                    f = self._issue(
                        k, unit, f"pace.p{unit.index}", plan=self.plan, bitmap_len=n_params
                    )
                    flights.append(f)
                    in_flight += f.nbytes
                    sent += 1
                    continue
            if flights:
                fold(flights.popleft())
                continue
            # Nothing known ready and nothing in flight: wait for a local gradient that the
            # others do not know about yet, then exchange readiness (every rank gets here at the
            # same decision point, so the probes match).
            self._dispatch_at = f"readiness probe of iteration {k} (waiting for gradients)"
            with self._cv:
                while not any(self.marks[j] > k and not known[j] for j in range(n_params)):
                    if self._stop:
                        raise _StoppedError
                    self._cv.wait()
            self._dispatch_at = f"readiness probe of iteration {k}"
            probe = self._issue(k, None, "pace.probe", plan=self.plan, bitmap_len=n_params)
            in_flight += probe.nbytes
            fold(probe)
        while flights:
            fold(flights.popleft())
        self._dispatch_at = f"end of iteration {k}"

    def _wait_done(self, f: _Flight) -> None:
        while not f.done.wait(0.5):
            if self._stop:
                raise _StoppedError

    # -----------------------------------------------------------------------------------------
    # Completion

    def _complete_loop(self) -> None:
        rng = random.Random(f"{self._seed}:complete:{self.backend.rank}")
        while True:
            f = self._queue.get()
            if f is None or self._stop:
                raise _StoppedError
            what = (
                f"{f.plan.describe(f.unit.index, self.infos)} of iteration {f.iteration}"
                if f.unit is not None
                else f"readiness probe of iteration {f.iteration}"
            )
            self._oldest_flight = what
            try:
                self.backend.wait(f.handle, self.timeout_s)
            except CollectiveTimeoutError as exc:
                self._fail(
                    f"rank {self.backend.rank}: {what} did not complete within "
                    f"{self.timeout_s:g} s ({exc}); another rank is stuck, dead or issued a "
                    "different schedule",
                    exc,
                )
                raise _StoppedError from exc
            except Exception as exc:  # e.g. a dead peer closed the connection
                self._fail(f"rank {self.backend.rank}: {what} failed: {exc}", exc)
                raise _StoppedError from exc
            self._oldest_flight = ""
            if self._monitor is not None and f.unit is not None:
                # Channel time of this unit: from when the channel could start it (its issue,
                # or the previous completion) to its completion.
                now = time.perf_counter()
                start = max(f.issued_s, self._last_done_s)
                self._last_done_s = now
                self._monitor.on_unit_done(f.unit.index, f.nbytes, (now - start) * 1e6)
            self._chaos(rng)
            for view, a, b in f.copy_back:
                view.copy_(f.buf[a:b])
            if f.bitmap_at >= 0:
                threshold = 1.0 - 0.5 / self.backend.size
                f.agreed = [v >= threshold for v in f.buf[f.bitmap_at :].tolist()]
            if self.mode == "replay":
                with self._cv:
                    self._in_flight_bytes -= f.nbytes
                    self._cv.notify_all()
            f.done.set()
            if f.unit is not None:
                self._finish_pieces(f.unit, f.iteration, f.plan)

    def _finish_pieces(self, unit: PlanUnit, k: int, plan: ReplayPlan) -> None:
        complete = []
        for piece in unit.pieces:
            i = piece.param
            left = self._remaining.pop((i, k), plan.pieces_per_param[i]) - 1
            if left == 0:
                complete.append(i)
            else:
                self._remaining[(i, k)] = left
        if not complete:
            return
        done = tuple(complete)
        self._updater(done, k)
        with self._cv:
            for i in done:
                zero = self._pending_zero[i]
                if zero is not None:
                    # Before the update becomes visible: the next backward must start from a
                    # cleared gradient, exactly as if zero_grad() had run after the update.
                    zero_param_grad(self.params[i], zero)
                    self._pending_zero[i] = None
                self.updated[i] = k + 1
            self._cv.notify_all()

    def _describe(self, unit: PlanUnit) -> str:
        return self.plan.describe(unit.index, self.infos)


class _StoppedError(Exception):
    """Internal: the engine is shutting down."""


def _itemsize(info: ParamInfo) -> int:
    return info.element_size


def zero_param_grad(p: torch.Tensor, set_to_none: bool) -> None:
    """``torch.optim.Optimizer.zero_grad`` for one parameter (engine-managed or not)."""
    if p.grad is None:
        return
    if set_to_none:
        p.grad = None
    else:
        if p.grad.grad_fn is not None:
            p.grad.detach_()
        else:
            p.grad.requires_grad_(False)
        p.grad.zero_()
