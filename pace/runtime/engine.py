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

import contextlib
import heapq
import itertools
import queue
import random
import threading
import time
import weakref
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, NoReturn, Protocol

import torch

from pace.errors import RuntimeReplayError
from pace.runtime.backends import Backend, CollectiveTimeoutError
from pace.runtime.failures import Reporter
from pace.runtime.plan import ParamInfo, PlanUnit, ReplayPlan

Mode = Literal["replay", "online"]
# Engines of this process, in creation order (the same on every rank, since every rank calls
# wrap() in the same order): collective names carry it, so a collective left in flight by a
# closed engine can never be matched with one of the next engine's.
_ENGINE_IDS = itertools.count()
# What a parameter without a gradient on this rank gets: "ddp" is DDP with
# find_unused_parameters=True (unused on every rank: .grad untouched and no update; used on some
# rank: the average), "zero" is hvd.DistributedOptimizer (a zero gradient, always reduced).
Unused = Literal["ddp", "zero"]
# Called with (parameter indices whose gradient is fully reduced, iteration).
Updater = Callable[[tuple[int, ...], int], None]


class RuntimeMonitor(Protocol):
    """What the runtime reports as it runs (``pace.drift.Monitor`` is one): gradient-ready
    times from the hooks, and each unit's channel time from the completion thread."""

    def on_grad_ready(self, tensor: int, t_us: float) -> None: ...

    def on_unit_done(self, unit_index: int, size_bytes: int, duration_us: float) -> None: ...


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
    used_at: int  # offset of the used-parameter map in buf; -1 if none
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
        monitor: RuntimeMonitor | None = None,
        sync: bool = False,
        unused: Unused = "zero",
        reporter: Reporter | None = None,
    ) -> None:
        self.params = list(params)
        # Where the runtime's own buffers live (readiness probes): the parameters' device.
        self._device = self.params[0].device if self.params else torch.device("cpu")
        self._name = f"pace.{next(_ENGINE_IDS)}"
        # sync: backward() returns with every gradient reduced and no update is applied here
        # (the user's step() does it); otherwise each update is applied as soon as it can be.
        self.sync = sync
        self.unused = unused
        self._reporter = reporter or Reporter(None, backend.rank, backend.size)
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
        # Inside no_sync(): gradients accumulate locally, nothing is marked or reduced.
        self.accumulating = False
        # Seconds the training thread spent blocked in wait_updated (forward pre-hooks).
        self.blocked_s = 0.0
        # Called on the training thread once an iteration is closed and, in the sync mode, fully
        # reduced: the drift loop's boundary (the wrapper's step() calls it in the other mode).
        # Its argument: when the backward pass ended (perf_counter seconds).
        self.after_close: Callable[[float], None] | None = None
        # Per parameter: (the gradient tensor, its version counter) when it was marked ready.
        # The runtime reduces through an alias with a version counter of its own, so any later
        # change of the version is a change the runtime did not make (clipping, unscale_, ...).
        self._seen: list[tuple[weakref.ref[torch.Tensor], int] | None] = [None] * n
        self._alias: list[torch.Tensor | None] = [None] * n
        # Per iteration: which parameters got a gradient from autograd on this rank (the map
        # the last unit carries when unused == "ddp"), the locally unused ones with the gradient
        # to restore if no rank used them, and their completions held back until the map is in.
        self._used: dict[int, list[bool]] = {}
        self._unused_local: dict[int, dict[int, torch.Tensor | None]] = {}
        self._held: dict[int, list[int]] = {}
        self._global_used: dict[
            int, list[bool]
        ] = {}  # (parameter, iteration) -> pieces still in flight; keyed by iteration so a schedule
        # switch never mixes the piece counts of two plans.
        self._remaining: dict[tuple[int, int], int] = {}
        self._in_flight_bytes = 0
        # What the dispatcher waits for in _wait_marked: (parameters, iteration), or None.
        self._wanted: tuple[Sequence[int], int] | None = None
        self._error: RuntimeReplayError | None = None
        self._stop = False
        self._closed = False
        # Where the dispatcher is, for time-out messages (written by the dispatcher only).
        self._dispatch_at = "not started"
        self._oldest_flight = ""
        self._queue: queue.SimpleQueue[_Flight | None] = queue.SimpleQueue()
        self._fused: dict[tuple[int, int, torch.dtype, torch.device], torch.Tensor] = {}
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
        if self.accumulating:
            return
        self._raise_if_failed()
        self._chaos(self._ready_rng)
        p = self.params[i]
        grad = p.grad
        if grad is None:  # pragma: no cover - autograd always sets it before this hook
            return
        if grad.is_sparse:
            self.refuse(f"parameter {self.infos[i].name!r}: sparse gradients are not supported")
        if not grad.is_contiguous():
            # The schedule's byte offsets refer to the row-major flattened gradient.
            p.grad = grad.contiguous()
        with self._cv:
            k = self.steps
            if self.marks[i] != k:
                self.refuse(
                    f"rank {self.backend.rank}: gradient of {self.infos[i].name!r} computed twice "
                    f"in iteration {k}: call step() after every backward(), or accumulate "
                    "gradients over several backward passes inside `with opt.no_sync():` (as "
                    "with DDP) for all but the last"
                )
            if self.updated[i] < k:
                self.refuse(
                    f"rank {self.backend.rank}: gradient of {self.infos[i].name!r} for iteration "
                    f"{k} arrived before its update of iteration {k - 1} finished: the parameter "
                    "is used outside the forward of the module that owns it; call "
                    "synchronize() before such uses"
                )
            first = self._marked_in_iteration == 0
            if first:
                self._on_iteration_start(k)
            self._marked_in_iteration += 1
            self._record(i)
            self._used.setdefault(k, [False] * len(self.params))[i] = True
            self.marks[i] = k + 1
            # Only the dispatcher waits for marks. Waking it for every gradient (hundreds per
            # iteration) costs a GIL hand-over each time, on the backward pass's own thread;
            # wake it when what it waits for is complete (the first mark of an iteration, any
            # mark in the online mode, the last parameter of the unit it waits for).
            wanted = self._wanted
            if (
                first
                or self.mode == "online"
                or wanted is None
                or (wanted[1] == k and all(self.marks[j] > k for j in wanted[0]))
            ):
                self._cv.notify_all()
        if first and self.sync:
            # Runs when this backward pass ends, on its thread: backward() returns only once
            # every gradient is reduced (what DDP's reducer does with the same callback).
            torch.autograd.Variable._execution_engine.queue_callback(self._end_of_backward)
        if self._monitor is not None:
            self._monitor.on_grad_ready(i, time.perf_counter() * 1e6)

    def check_step(self) -> None:
        """Sync mode, before the optimizer's own step: no failure, not inside ``no_sync()``."""
        self._raise_if_failed()
        if self.accumulating:
            self.refuse(
                f"rank {self.backend.rank}: step() inside no_sync(): the gradients accumulated "
                "there are not reduced yet; run the last backward() outside no_sync(), then step()"
            )

    def _record(self, i: int) -> None:
        """Remember parameter ``i``'s final gradient and make the alias the runtime reduces."""
        grad = self.params[i].grad
        assert grad is not None
        with torch.no_grad():
            alias = torch.empty(0, dtype=grad.dtype, device=grad.device)
            alias.set_(grad.untyped_storage(), grad.storage_offset(), (grad.numel(),), (1,))
        self._alias[i] = alias
        self._seen[i] = (weakref.ref(grad), grad._version)

    def _check_untouched(self, what: str) -> None:
        """Overlapped mode: raise if a gradient marked in the open iteration has been changed."""
        if self.sync:
            return
        k = self.steps
        for i, p in enumerate(self.params):
            seen = self._seen[i]
            if self.marks[i] != k + 1 or seen is None:
                continue
            ref, version = seen
            grad = p.grad
            if grad is not None and ref() is grad and grad._version == version:
                continue
            self.refuse(
                f"rank {self.backend.rank}: the gradient of {self.infos[i].name!r} was changed "
                f"between backward() and {what} (gradient clipping, GradScaler's unscale_, or "
                "an edit of .grad); in the overlapped mode the runtime reduces each gradient "
                "and applies its update while backward() runs, so the change cannot take "
                "effect. Use wrap(..., sync=True) with a schedule compiled by `pace compile "
                "--mode sync`: backward() then returns with every gradient reduced, as with DDP"
            )

    def refuse(self, message: str) -> NoReturn:
        """Raise a usage error on this rank, and tell the other ranks why this one stops."""
        self._reporter.publish(message)
        raise RuntimeReplayError(message)

    def _end_of_backward(self) -> None:
        """Sync mode: close the iteration and wait until every gradient is reduced."""
        backward_end_s = time.perf_counter()
        self.close_iteration()
        with self._cv:
            self._wait_locked(
                lambda: all(u >= self.steps for u in self.updated),
                "backward()",
                range(len(self.params)),
            )
        if self.after_close is not None:
            self.after_close(backward_end_s)

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
        """Every gradient not marked yet is final now (``step()``, or the end of backward in
        the sync mode); a parameter without one gets zeros (see ``Unused``)."""
        self.check_step()
        self._check_untouched("step()")
        with self._cv:
            k = self.steps
            started = self._marked_in_iteration > 0
            todo = [i for i, m in enumerate(self.marks) if m == k]
            # Re-reducing a gradient whose previous reduction is still in flight would race on
            # the same memory (step() twice without a forward in between).
            self._wait_locked(lambda: all(self.updated[i] >= k for i in todo), "step()", todo)
            if not started:
                self._on_iteration_start(k)
            unused: dict[int, torch.Tensor | None] = {}
            for i in todo:
                p = self.params[i]
                if self.unused == "ddp":
                    # Restored if no rank used it (DDP leaves .grad untouched then).
                    unused[i] = None if p.grad is None else p.grad.clone()
                if p.grad is None:
                    # Every rank must issue the same collectives; another rank may have a
                    # gradient for this parameter.
                    p.grad = torch.zeros_like(p, memory_format=torch.contiguous_format)
                elif not p.grad.is_contiguous():
                    p.grad = p.grad.contiguous()
                self._record(i)
                self.marks[i] = k + 1
            self._used.setdefault(k, [False] * len(self.params))
            self._used.pop(k - 2, None)
            if unused:
                self._unused_local[k] = unused
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
            self.refuse(
                f"rank {self.backend.rank}: {what} between backward() and step(): its parameters "
                "are already being updated; call step() first, or, to accumulate gradients over "
                "several forward/backward passes, run all but the last inside "
                "`with opt.no_sync():` (as with DDP)"
            )
        if self._error is None and all(updated[i] >= steps for i in indices):
            return
        t0 = time.perf_counter()
        with self._cv:
            self._wait_locked(
                lambda: all(self.updated[i] >= self.steps for i in indices), what, indices
            )
        # Forward time spent waiting for communication, not computing (the drift monitor's
        # forward compute is the span minus this).
        self.blocked_s += time.perf_counter() - t0

    def pending(self) -> bool:
        """Whether a parameter's update of a closed iteration is still in flight."""
        return min(self.updated, default=self.steps) < self.steps

    def iteration_open(self) -> bool:
        """True between the first gradient of an iteration and its step()."""
        return self._marked_in_iteration > 0

    def zero_grad(self, set_to_none: bool) -> None:
        """Zero now where the update is done, else right after the update (before it is visible)."""
        self._raise_if_failed()
        with self._cv:
            if self.iteration_open():
                self._check_untouched("zero_grad()")
                self.refuse(
                    f"rank {self.backend.rank}: zero_grad() was called after backward() but "
                    "before step(): the gradients are being reduced; call step() first"
                )
            for i, p in enumerate(self.params):
                if self.updated[i] >= self.steps:
                    zero_param_grad(p, set_to_none)
                else:
                    self._pending_zero[i] = set_to_none

    def synchronize(self) -> None:
        self._raise_if_failed()
        if self.iteration_open() and not self.sync:
            self._check_untouched("synchronize()")
            self.refuse(
                f"rank {self.backend.rank}: synchronize() was called between backward() and "
                "step(): in the overlapped mode the runtime applies each update as soon as its "
                "gradient is reduced, so gradients cannot be inspected or changed before step() "
                "(e.g. Horovod's `opt.synchronize(); clip_grad_norm_(...); with "
                "opt.skip_synchronize(): opt.step()`). Use wrap(..., sync=True) with a schedule "
                "compiled by `pace compile --mode sync`"
            )
        self.wait_updated(range(len(self.params)), "synchronize()")

    def close(self, join_timeout_s: float | None = None) -> None:
        """Stop both threads and wait for them (clean shutdown; idempotent).

        ``join_timeout_s``: at interpreter exit a short one, so a rank that fails while a
        collective is in flight exits (and its peers learn it) instead of waiting out the
        collective's time-out.
        """
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
                t.join(self.timeout_s + 5.0 if join_timeout_s is None else join_timeout_s)
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
                if self._device.type == "cuda":
                    # The current CUDA device is per thread (0 in a new one): make it the
                    # parameters', so whatever this thread allocates or launches without an
                    # explicit device lands there (a rank on cuda:3 of an 8-GPU node).
                    torch.cuda.set_device(self._device)
                body()
            except _StoppedError:
                pass
            except BaseException as exc:  # any failure must reach the trainer
                message = f"rank {self.backend.rank}: runtime thread failed: {exc!r}"
                self._reporter.publish(message)
                self._fail(message, exc)

        return run

    def _chaos(self, rng: random.Random) -> None:
        if self._delay_s > 0:
            time.sleep(rng.uniform(0.0, self._delay_s))

    # -----------------------------------------------------------------------------------------
    # Dispatcher

    def _wait_until(self, ready: Callable[[], bool]) -> None:
        """Wait on ``_cv`` (held by the caller) until ``ready()``; raise ``_StoppedError`` if
        the engine stops first."""
        while not ready():
            if self._stop:
                raise _StoppedError
            self._cv.wait()

    def _wait_marked(self, params: Sequence[int], k: int) -> None:
        with self._cv:
            # mark_ready wakes this thread only when the last of these is marked.
            self._wanted = (params, k)
            try:
                self._wait_until(lambda: all(self.marks[i] > k for i in params))
            finally:
                self._wanted = None
            if self._stop:
                raise _StoppedError

    def _wait_any_marked(self, k: int) -> None:
        with self._cv:
            # Iteration k has begun: closed, or current (steps == k) with a gradient marked.
            # (A mark counted while steps < k belongs to an earlier iteration.)
            self._wait_until(
                lambda: self.steps > k or (self.steps == k and bool(self._marked_in_iteration))
            )

    def _wait_drained(self) -> None:
        with self._cv:
            self._wait_until(lambda: self._in_flight_bytes <= 0)

    def _wait_credit(self, nbytes: int) -> None:
        with self._cv:
            self._wait_until(
                lambda: (
                    self._in_flight_bytes <= 0
                    or self._in_flight_bytes + nbytes <= self.credit_bytes
                )
            )
            self._in_flight_bytes += nbytes

    def _pack(self, unit: PlanUnit, extra: int) -> tuple[torch.Tensor, list[Any], int]:
        """The buffer that carries ``unit`` (and ``extra`` trailing elements), its copy-back
        list and where the extra elements start (-1 if none)."""
        views = []
        for piece in unit.pieces:
            # The alias, not .grad: the runtime's in-place writes must not move the version
            # counter that _check_untouched watches.
            flat = self._alias[piece.param]
            assert flat is not None  # marked ready => recorded
            views.append(
                flat
                if piece.start == 0 and piece.stop == flat.numel()
                else flat[piece.start : piece.stop]
            )
        scale = self.backend.pre_scale
        if len(views) == 1 and extra == 0:
            # A single piece is reduced in place: no copy at all. Its pre-scale is one pass over
            # the gradient here, long before the unit's turn on the link for all but the first.
            if scale != 1.0:
                views[0].mul_(scale)
            return views[0], [], -1
        numel = unit.numel + extra
        key = (unit.index, numel, views[0].dtype, views[0].device)
        buf = self._fused.get(key)
        if buf is None:
            buf = torch.empty(numel, dtype=views[0].dtype, device=views[0].device)
            self._fused[key] = buf
        copy_back = []
        at = 0
        for v in views:
            n = v.numel()
            copy_back.append((v, at, at + n))
            at += n
        pack_pieces(views, buf[:at], scale)
        return buf, copy_back, (at if extra else -1)

    def _issue(
        self,
        k: int,
        unit: PlanUnit | None,
        name: str,
        *,
        plan: ReplayPlan,
        bitmap: bool = False,
        used: bool = False,
    ) -> _Flight:
        """Start one collective. ``bitmap``: append this rank's readiness of every gradient
        (online mode); ``used``: append which parameters autograd gave a gradient here (the
        iteration's last unit, when ``unused == "ddp"``)."""
        n = len(self.params)
        extra = n * (int(bitmap) + int(used))
        if unit is None:
            # On the parameters' device: NCCL reduces CUDA tensors only.
            buf = torch.empty(extra, dtype=torch.float32, device=self._device)
            copy_back: list[Any] = []
            extra_at = 0
        else:
            buf, copy_back, extra_at = self._pack(unit, extra)
        values: list[float] = []
        with self._cv if extra else contextlib.nullcontext():
            if bitmap:
                # Which gradients are ready here, now; the average over ranks is 1 only for the
                # gradients ready on every rank, which every rank then learns identically.
                values += [1.0 if m > k else 0.0 for m in self.marks]
            if used:
                # Final here: the last unit goes only after every parameter was marked, by its
                # hook (used) or by closing the iteration (unused).
                values += [1.0 if u else 0.0 for u in self._used.get(k, [False] * n)]
        if values:
            src = torch.tensor(values, dtype=buf.dtype)
            if buf.is_cuda:
                # From pinned memory, asynchronously: a copy from pageable memory would block
                # this thread until the device has run everything queued before it (the rest
                # of the backward pass). The host allocator keeps the block until the copy ran.
                buf[extra_at:].copy_(src.pin_memory(), non_blocking=True)
            else:
                buf[extra_at:] = src
        nbytes = buf.numel() * buf.element_size()
        flight = _Flight(
            iteration=k,
            unit=unit,
            buf=buf,
            handle=self.backend.start(buf, name),
            copy_back=copy_back,
            nbytes=nbytes,
            bitmap_at=extra_at if bitmap else -1,
            used_at=(extra_at + (n if bitmap else 0)) if used else -1,
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
        # Nothing of iteration k-1 in flight before k's first unit: a unit of k may reuse a
        # buffer (a fused buffer, or a gradient reduced in place) that one of k-1 still holds,
        # e.g. for a parameter the forward of k did not use and so never waited for. In a
        # training loop k's first gradient comes long after k-1's last unit, so this costs
        # nothing; it makes queueing every ready unit (an in-order backend) safe.
        self._dispatch_at = f"start of iteration {k} (waiting for iteration {k - 1}'s units)"
        self._wait_drained()
        plan = self._plan_for(k)
        for unit in plan.units:
            where = f"{plan.describe(unit.index, self.infos)} of iteration {k}"
            self._dispatch_at = f"{where} (waiting for gradients)"
            self._wait_marked(unit.params, k)
            self._chaos(rng)
            nbytes = unit.numel * _itemsize(self.infos[unit.pieces[0].param])
            self._dispatch_at = f"{where} (waiting for credit)"
            self._wait_credit(nbytes)
            last = unit is plan.units[-1] and self.unused == "ddp"
            self._issue(k, unit, f"{self._name}.{unit.index}", plan=plan, used=last)
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
                        k,
                        unit,
                        f"{self._name}.p{unit.index}",
                        plan=self.plan,
                        bitmap=True,
                        used=sent == len(self.plan.units) - 1 and self.unused == "ddp",
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
                self._wait_until(
                    lambda: any(self.marks[j] > k and not known[j] for j in range(n_params))
                )
            self._dispatch_at = f"readiness probe of iteration {k}"
            probe = self._issue(k, None, f"{self._name}.probe", plan=self.plan, bitmap=True)
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
                    f"different schedule{self._reporter.explain()}",
                    exc,
                )
                raise _StoppedError from exc
            except Exception as exc:  # e.g. a dead peer closed the connection
                first = str(exc).strip().splitlines()[0] if str(exc).strip() else repr(exc)
                self._fail(
                    f"rank {self.backend.rank}: {what} failed: {first}{self._reporter.explain()}",
                    exc,
                )
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
            unpack_pieces(f.buf, f.copy_back)
            n_params = len(self.params)
            # The maps were appended unscaled: each entry is the number of ranks with a 1 there,
            # times the reduction's own scale.
            ranks_per_unit = 1.0 / self.backend.sum_scale
            if f.bitmap_at >= 0:
                bits = f.buf[f.bitmap_at : f.bitmap_at + n_params].tolist()
                f.agreed = [v * ranks_per_unit >= self.backend.size - 0.5 for v in bits]
            if f.used_at >= 0 and self._unused_local.get(f.iteration):
                # The average is > 0 exactly for the parameters some rank used. Read only when
                # this rank has parameters it did not use: for the others the answer is known
                # (used, here), and reading it on a GPU would block this thread until the
                # device finished the reduction, so the next forward could not be queued ahead.
                used = f.buf[f.used_at : f.used_at + n_params].tolist()
                self._global_used[f.iteration] = [v * ranks_per_unit > 0.5 for v in used]
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
        unused = self._unused_local.get(k)
        # Set only by the iteration's last unit, which every other unit completed before.
        used = self._global_used.pop(k, None)
        if unused:
            # A parameter no autograd hook marked here waits for the used map to know whether
            # any rank used it.
            held = self._held.setdefault(k, [])
            held.extend(i for i in complete if i in unused)
            complete = [i for i in complete if i not in unused]
            if used is not None:
                restored = []
                for i in held:
                    if used[i]:
                        complete.append(i)
                    else:
                        # Unused on every rank: DDP leaves .grad as it was and nothing updates.
                        self.params[i].grad = unused[i]
                        restored.append(i)
                self._release(tuple(restored), k)
                del self._held[k], self._unused_local[k]
        if complete:
            done = tuple(complete)
            if not self.sync:
                self._updater(done, k)
            self._release(done, k)

    def _release(self, done: tuple[int, ...], k: int) -> None:
        """Parameters ``done`` carry iteration ``k``'s result now: let the trainer go on."""
        if not done:
            return
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


def pack_pieces(views: Sequence[torch.Tensor], out: torch.Tensor, scale: float) -> None:
    """Write the flat ``views`` one after another into ``out``, each times ``scale``
    (``Backend.pre_scale``; 1.0 where the reduction averages itself).

    On the CPU each piece is written by one multiply straight from its gradient into the buffer:
    one pass over the unit's bytes fewer than a copy and then a scale, the same product, so the
    same bits (benchmarks/bench_copy_back.py). On a GPU, or with nothing to scale, one copy for
    the whole unit (one kernel rather than one per piece), then the scale in place."""
    if scale != 1.0 and not out.is_cuda:
        at = 0
        for v in views:
            n = v.numel()
            torch.mul(v, scale, out=out[at : at + n])
            at += n
        return
    torch.cat(list(views), out=out)
    if scale != 1.0:
        out.mul_(scale)


def unpack_pieces(buf: torch.Tensor, copy_back: Sequence[tuple[torch.Tensor, int, int]]) -> None:
    """Hand each piece of a reduced ``buf`` back to its gradient (``copy_back``: the gradient
    view and its span in ``buf``; empty where the unit was reduced in place): one
    ``_foreach_copy_`` for the whole unit (on a GPU one launch rather than one per piece)."""
    if copy_back:
        torch._foreach_copy_(
            [view for view, _, _ in copy_back], [buf[a:b] for _, a, b in copy_back]
        )


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
