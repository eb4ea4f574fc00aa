"""``wrap(optimizer, model, schedule=...)``: the one-line integration.

The returned object is an instance of a subclass of the optimizer's own class (as Horovod's
``DistributedOptimizer`` does), sharing ``param_groups``, ``state`` and ``defaults`` with the
wrapped optimizer, so learning-rate schedulers and ``state_dict`` keep working.

Per-parameter updates for *any* optimizer: a ``torch.optim`` optimizer updates each parameter
from that parameter's gradient, its hyper-parameters and its own ``state[p]`` only. So when the
gradients of a set S of parameters are reduced, the runtime runs the optimizer class's own
``step`` on a *view* of the optimizer: a shallow instance whose ``__dict__`` is the optimizer's
(same ``state`` mapping, same ``defaults``) but whose ``param_groups`` hold only S, each group
carrying the hyper-parameters in force for that iteration. Same code path, same arithmetic, one
parameter at a time: bitwise what one ``step()`` over all parameters computes. Optimizers that
couple parameters (LBFGS: one closure, one flat state) are refused.

Why not step the real optimizer with the other gradients hidden (set to ``None``)? The
training thread is still running backward and writing those gradients while an update runs;
hiding them would race. The view touches nothing but S.
"""

from __future__ import annotations

import atexit
import contextlib
import functools
import math
import os
import sys
import time
import types
import warnings
import weakref
from collections import OrderedDict
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, cast

import torch

from pace.drift.loop import DriftLoop, DriftOptions
from pace.errors import InputError, RuntimeReplayError, ScheduleMismatchError
from pace.ir import Schedule, Trace
from pace.runtime.backends import (
    HOROVOD_ENV,
    Backend,
    CollectiveTimeoutError,
    horovod_broadcast_from_rank0,
    horovod_unreducible,
    import_horovod,
    make_backend,
    wait_polling,
)
from pace.runtime.engine import Engine, RuntimeMonitor, zero_param_grad
from pace.runtime.failures import Reporter, horovod_board, torch_board
from pace.runtime.plan import (
    ParamInfo,
    ReplayPlan,
    partition_params,
    plan_from_schedule,
    wfbp_plan,
)
from pace.runtime.reads import ReadGuard

BackendName = Literal["horovod", "torch"]

# Attributes a learning-rate scheduler (or the user) may have patched onto the optimizer
# instance; copying them would shadow the wrapper's own methods.
_OWN_METHODS = (
    "step",
    "zero_grad",
    "synchronize",
    "skip_synchronize",
    "no_sync",
    "state_dict",
    "load_state_dict",
    "close",
)


# ByteScheduler's default credit for the online mode (its partition size is
# ``RuntimeOptions.partition_bytes``).
ONLINE_CREDIT_BYTES = 16 * 2**20
# A replay on an in-order backend: every ready unit may be queued.
UNLIMITED_CREDIT_BYTES = 2**62


@dataclass(frozen=True, kw_only=True, slots=True)
class RuntimeOptions:
    """Knobs of the replay runtime.

    ``credit_bytes``: bytes of collectives allowed in flight (one unit always may go).
    ``None`` (default): replaying a schedule, every unit is issued as soon as its gradients are
    ready, in the schedule's order, when the backend runs collectives one after another in
    issue order (``Backend.in_order``: Horovod with fusion and cache off, NCCL, pace's
    one-thread gloo group), so the link goes from one unit to the next without waiting for a
    Python thread; one unit at a time otherwise. Either way the link carries one unit at a
    time, smallest priority first: the schedule's replay contract (docs/schedule-format.md;
    ``predicted_iteration_us`` is computed that way). In the online mode
    ``ONLINE_CREDIT_BYTES``, ByteScheduler's window.
    ``partition_bytes``: online mode (no schedule) only, ByteScheduler's partition size.
    ``timeout_s``: any wait on a collective or on an update longer than this is an error.
    ``inject_delay_s``: testing only; sleep a random ``[0, inject_delay_s)`` in every gradient
    hook, before every issue and before every completion (seeded by ``seed`` and the rank).
    ``sync``: ``backward()`` returns with every gradient reduced, as DDP's does, and ``step()``
    is the optimizer's own; for loops that read or change gradients before ``step()``
    (clipping, ``GradScaler``, inspection). Needs a schedule compiled with ``--mode sync``.
    ``broadcast_buffers``: copy rank 0's buffers (BatchNorm statistics, ...) to every rank at
    the start of each training forward, exactly when DDP's ``broadcast_buffers=True`` does;
    ``None`` follows the backend's reference: on for ``"torch"`` (DDP's default), off for
    ``"horovod"`` (``hvd.DistributedOptimizer`` never touches buffers).
    """

    credit_bytes: int | None = None
    partition_bytes: int = 4 * 2**20
    timeout_s: float = 300.0
    inject_delay_s: float = 0.0
    seed: int = 0
    sync: bool = False
    broadcast_buffers: bool | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.sync, bool):
            raise InputError(f"must be True or False, got {self.sync!r}", where="sync")
        if self.broadcast_buffers is not None and not isinstance(self.broadcast_buffers, bool):
            raise InputError(
                f"must be True, False or None, got {self.broadcast_buffers!r}",
                where="broadcast_buffers",
            )
        if self.credit_bytes is not None and not (
            isinstance(self.credit_bytes, int)
            and not isinstance(self.credit_bytes, bool)
            and self.credit_bytes > 0
        ):
            raise InputError(
                f"must be an integer > 0, got {self.credit_bytes!r}", where="credit_bytes"
            )
        if not (isinstance(self.partition_bytes, int) and self.partition_bytes > 0):
            raise InputError(
                f"must be an integer > 0, got {self.partition_bytes!r}", where="partition_bytes"
            )
        if not self.timeout_s > 0:
            raise InputError(f"must be > 0, got {self.timeout_s!r}", where="timeout_s")
        if not self.inject_delay_s >= 0:
            raise InputError(f"must be >= 0, got {self.inject_delay_s!r}", where="inject_delay_s")


def _credit_bytes(options: RuntimeOptions, mode: str, in_order: bool) -> int:
    if options.credit_bytes is not None:
        return options.credit_bytes
    if mode == "online":
        return ONLINE_CREDIT_BYTES
    # In order: no window needed, the backend queues. Otherwise 1 byte: a unit may start only
    # when nothing is in flight (one unit always may go).
    return UNLIMITED_CREDIT_BYTES if in_order else 1


class PaceOptimizer(torch.optim.Optimizer):
    """Methods of the wrapper; ``wrap`` mixes them into a subclass of the optimizer's class."""

    _pace_engine: Engine
    _pace_drift: DriftLoop | None
    _pace_base: type[torch.optim.Optimizer]
    _pace_params: list[torch.nn.Parameter]
    _pace_group_of: list[int]
    _pace_snapshots: dict[int, list[dict[str, Any]]]
    _pace_handles: list[Any]
    _pace_guard: ReadGuard | None
    _pace_plan: ReplayPlan
    _pace_infos: list[ParamInfo]
    _step_supports_amp_scaling: bool

    # --- the usual contracts -----------------------------------------------------------------

    def step(  # type: ignore[override]
        self, closure: Callable[[], float] | None = None, *, grad_scaler: Any = None
    ) -> None:
        """Close the iteration and return; updates finish in the background.

        Every gradient of this iteration is final now (a parameter without a gradient gets a
        zero one, as with Horovod). Each module's next forward waits for its own parameters'
        updates, and a read of a parameter (or its gradient) on this thread before then waits
        for that parameter's (pace.runtime.reads).
        """
        if grad_scaler is not None:
            # Only the overlapped mode declares _step_supports_amp_scaling, so that
            # GradScaler.step() hands itself here instead of unscaling in place (an unscale
            # on the CPU does not move the gradients' version counters).
            self._pace_engine.refuse(
                f"rank {self._pace_engine.backend.rank}: GradScaler.step() in the overlapped "
                "mode: the runtime already applied updates with the scaled gradients while "
                "backward() ran. Use wrap(..., sync=True) with a schedule compiled by `pace "
                "compile --mode sync`: backward() then returns with every gradient reduced, as "
                "with DDP, and GradScaler works unchanged"
            )
        if self._pace_engine.sync:
            self._pace_engine.check_step()
            self._pace_base.step(self, closure)
        else:
            self._overlapped_step(closure)

    def _overlapped_step(self, closure: Callable[[], float] | None) -> None:
        if closure is not None:
            raise InputError(
                "step(closure) is not supported in the overlapped mode; use sync=True",
                where="step",
            )
        for pre in list(self._optimizer_step_pre_hooks.values()):
            pre(self, (), {})
        backward_end_s = time.perf_counter()
        self._pace_engine.close_iteration()
        if self._pace_drift is not None:
            self._pace_after_close(backward_end_s)
        for post in list(self._optimizer_step_post_hooks.values()):
            post(self, (), {})
        if self._pace_guard is not None:
            self._pace_guard.after_step()

    def _pace_after_close(self, backward_end_s: float) -> None:
        """Drift: the iteration just closed on this rank; agree on and install a new plan."""
        loop = self._pace_drift
        assert loop is not None
        loop.monitor.on_backward_end(backward_end_s * 1e6)
        new = loop.boundary(self._pace_engine.steps - 1, time.perf_counter() * 1e6)
        if new is not None:
            self.switch_schedule(new, where="drift re-plan")

    def zero_grad(self, set_to_none: bool = True) -> None:
        guard = self._pace_guard
        with guard.suspended() if guard is not None else contextlib.nullcontext():
            self._pace_engine.zero_grad(set_to_none)
            managed = {id(p) for p in self._pace_params}
            for group in self.param_groups:
                for p in group["params"]:
                    if id(p) not in managed and p.grad is not None:
                        zero_param_grad(p, set_to_none)

    def synchronize(self) -> None:
        """Wait for every outstanding collective and parameter update (or raise their error).

        In the sync mode gradients are already reduced when ``backward()`` returns, so this is
        Horovod's ``opt.synchronize()`` as well: ``opt.synchronize(); clip...; with
        opt.skip_synchronize(): opt.step()`` works unchanged.
        """
        self._pace_engine.synchronize()
        if self._pace_guard is not None:
            self._pace_guard.release()

    @contextlib.contextmanager
    def skip_synchronize(self) -> Iterator[None]:
        """Horovod's ``skip_synchronize()``: ``step()`` never re-reduces here, so a no-op."""
        yield

    @contextlib.contextmanager
    def no_sync(self) -> Iterator[None]:
        """DDP's ``no_sync()``: backward passes inside accumulate gradients locally, with no
        communication; the next backward outside reduces the accumulated gradients."""
        engine = self._pace_engine
        if engine.accumulating:
            yield
            return
        engine.accumulating = True
        try:
            yield
        finally:
            engine.accumulating = False

    def state_dict(self) -> dict[str, Any]:
        self.synchronize()
        return super().state_dict()

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.synchronize()
        super().load_state_dict(state_dict)

    def close(self) -> None:
        """Stop the runtime's threads and remove its hooks (also run at interpreter exit)."""
        for h in self._pace_handles:
            h.remove()
        self._pace_handles.clear()
        if self._pace_guard is not None:
            self._pace_guard.release()
        self._pace_engine.close()
        if self._pace_drift is not None:
            self._pace_drift.close()

    def switch_schedule(self, schedule: Schedule, *, where: str = "schedule") -> int:
        """Replay ``schedule`` from the next iteration on; returns that iteration's number.

        Call on every rank at the same boundary, between ``step()`` and the next backward
        (``pace.drift``'s switch protocol decides when). The schedule is checked against the
        model first (``ScheduleMismatchError``); a refused schedule leaves the current one on.
        """
        mode = "sync" if self._pace_engine.sync else "overlap"
        if schedule.mode != mode:
            raise ScheduleMismatchError(
                f"the schedule was compiled for the {schedule.mode} mode but the runtime runs "
                f"the {mode} mode",
                where=where,
                field="mode",
            )
        plan = plan_from_schedule(schedule, self._pace_infos, where=where)
        at = self._pace_engine.switch_plan(plan)
        self._pace_plan = plan
        return at

    @property
    def pace_plan(self) -> ReplayPlan:
        return self._pace_plan

    @property
    def pace_param_names(self) -> tuple[str, ...]:
        """Names of the reduced parameters; a monitor's tensor indices refer to this order."""
        return tuple(info.name for info in self._pace_infos)

    # --- internals ---------------------------------------------------------------------------

    def _pace_iteration_start(self, k: int) -> None:
        # Hyper-parameters in force for iteration k, taken when its first gradient arrives
        # (an LR scheduler steps after step(), i.e. before the next backward).
        self._pace_snapshots[k] = [
            {key: v for key, v in g.items() if key != "params"} for g in self.param_groups
        ]
        self._pace_snapshots.pop(k - 2, None)

    def _pace_update(self, indices: tuple[int, ...], k: int) -> None:
        snapshot = self._pace_snapshots[k]
        by_group: dict[int, list[torch.nn.Parameter]] = {}
        for i in indices:
            by_group.setdefault(self._pace_group_of[i], []).append(self._pace_params[i])
        view = object.__new__(self._pace_base)
        view.__dict__.update(self.__dict__)
        view.__dict__["param_groups"] = [
            {**snapshot[g], "params": ps} for g, ps in sorted(by_group.items())
        ]
        # Step hooks run once per step() on the wrapper, not once per parameter.
        view.__dict__["_optimizer_step_pre_hooks"] = OrderedDict()
        view.__dict__["_optimizer_step_post_hooks"] = OrderedDict()
        self._pace_base.step(view)


def _param_info(name: str, p: torch.nn.Parameter) -> ParamInfo:
    return ParamInfo(
        name=name,
        numel=p.numel(),
        element_size=p.element_size(),
        dtype=str(p.dtype).removeprefix("torch."),
    )


def _managed_params(
    optimizer: torch.optim.Optimizer, model: torch.nn.Module
) -> tuple[list[str], list[torch.nn.Parameter], list[int]]:
    """Trainable parameters of the optimizer, in the model's registration order, with names."""
    group_of: dict[int, int] = {}
    for g, group in enumerate(optimizer.param_groups):
        for p in group["params"]:
            if p.requires_grad and p.numel() > 0:
                group_of[id(p)] = g
    names, params, groups = [], [], []
    for name, p in model.named_parameters():
        if id(p) in group_of:
            names.append(name)
            params.append(p)
            groups.append(group_of.pop(id(p)))
    if group_of:
        raise InputError(
            f"{len(group_of)} parameter(s) of the optimizer are not parameters of the model",
            where="wrap",
        )
    return names, params, groups


def _load(
    schedule: str | Path | Schedule, trace: str | Path | Trace | None
) -> tuple[Schedule, str, Trace | None]:
    """The schedule, the name to blame in errors, and the trace (checked against it) if given."""
    from pace import io

    tr_obj = trace if isinstance(trace, Trace) or trace is None else io.load_trace(trace)
    if isinstance(schedule, Schedule):
        if tr_obj is not None:
            from pace.verify import verify_schedule

            verify_schedule(schedule, tr_obj, where="schedule")
        return schedule, "schedule", tr_obj
    return io.load_schedule(schedule, trace=tr_obj), str(schedule), tr_obj


def wrap(
    optimizer: torch.optim.Optimizer,
    model: torch.nn.Module,
    schedule: str | Path | Schedule | None = None,
    *,
    backend: BackendName = "horovod",
    trace: str | Path | Trace | None = None,
    fallback: bool = False,
    options: RuntimeOptions | None = None,
    monitor: RuntimeMonitor | None = None,
    drift: bool | DriftOptions = False,
    **knobs: Any,
) -> torch.optim.Optimizer:
    """Replay ``schedule`` for ``model``'s gradients; returns the optimizer to train with.

    ``schedule``: a schedule file (``pace compile`` output), a ``Schedule``, or ``None`` for the
    online mode (ByteScheduler's algorithm: priority by layer order, fixed partition size,
    credit window). ``trace``: optionally the trace it was compiled from, to check its digest.
    ``backend``: ``"horovod"`` (``hvd.init()`` is called if needed, with Horovod's fusion and
    response cache off) or ``"torch"`` (an initialised ``torch.distributed``).
    ``fallback``: on a schedule that cannot be replayed on this model, warn once and train with
    plain data parallelism (Horovod's own path, below, or one all-reduce per gradient in
    backward order for ``"torch"``) instead of raising ``InputError``/``ScheduleMismatchError``.
    ``monitor``: e.g. a ``pace.drift.Monitor`` over ``pace_param_names``; the runtime calls its
    ``on_grad_ready(index, t_us)`` from the gradient hooks and ``on_unit_done(unit, bytes,
    channel_us)`` from the completion thread (times from ``time.perf_counter``).
    ``drift``: ``True`` (or a ``pace.drift.DriftOptions``) turns on drift re-planning: the
    runtime feeds a monitor, rank 0 re-estimates and recompiles in the background when the
    observed iteration time leaves the predicted band, and every rank switches to an accepted
    schedule at the same iteration (docs/drift.md). Needs ``trace=`` (the trace the schedule
    was compiled from). Decisions are logged on the ``pace.drift`` logger.
    ``knobs``: fields of ``RuntimeOptions`` (``credit_bytes=``, ``timeout_s=``, ...).

    The framework's own path: a schedule whose ``framework`` is ``"horovod"`` (``pace compile``
    sets it where it predicts Horovod's own data parallelism, with tensor fusion and the response
    cache, faster than replaying the units; ``--no-framework`` turns that off) is checked against
    the model as any other, then trained with ``hvd.DistributedOptimizer``: ``hvd.init()`` under
    the environment as it is (pace's fusion and cache settings are not imposed; a warning if
    they are in force), rank 0's parameters and buffers broadcast, the optimizer's parameters
    named as in the model. The results are exactly Horovod's. ``sync=True`` keeps its promise
    (``backward()`` returns with every gradient reduced); ``step()``/``synchronize()`` never
    reduce a gradient twice; ``no_sync()`` accumulates locally; ``close()`` does nothing; the
    returned object is Horovod's optimizer (its own class and state), not a ``PaceOptimizer``.
    Refused: another ``backend`` (``ScheduleMismatchError``, field ``framework``) and ``drift``
    (``InputError``). ``monitor`` gets no events (a warning); of the replay's knobs only
    ``timeout_s`` applies: the wait for Horovod's reductions sleeps between polls where
    Horovod's own spins a core, and a wait longer than ``timeout_s`` raises
    ``RuntimeReplayError`` naming the rank and the gradient. One ``RuntimeWarning`` says the
    path is taken, with the two predictions when the schedule has them (``meta.framework``).
    The fallback on Horovod takes the same path.

    Must be called on every rank with the same arguments (the torch backend creates a process
    group here).
    """
    if options is None:
        options = RuntimeOptions(**knobs)
    elif knobs:
        raise InputError(f"pass either options= or {sorted(knobs)}, not both", where="wrap")
    if isinstance(optimizer, PaceOptimizer):
        raise InputError("this optimizer is already wrapped", where="wrap")
    if isinstance(optimizer, torch.optim.LBFGS) and not options.sync:
        raise InputError(
            "LBFGS couples all parameters in one update and cannot be updated per parameter; "
            "use sync=True",
            where="wrap",
        )
    if backend not in ("horovod", "torch"):
        raise InputError(
            f"unknown backend {backend!r}; choose 'horovod' or 'torch'", where="backend"
        )
    # torch.compile(model) returns a wrapper whose parameter names carry "_orig_mod."; the
    # schedule names the model's own parameters, and hooks inside the compiled module would
    # break its graph, so names, per-module hooks and broadcasts use the original module.
    inner = getattr(model, "_orig_mod", None)
    compiled = isinstance(inner, torch.nn.Module)
    module = inner if isinstance(inner, torch.nn.Module) else model
    names, params, group_of = _managed_params(optimizer, module)
    infos = [_param_info(n, p) for n, p in zip(names, params, strict=True)]
    if backend == "horovod":
        _refuse_unreducible(list(zip(names, params, strict=True)))
    want_mode = "sync" if options.sync else "overlap"

    mode: Literal["replay", "online"] = "replay"
    loaded: Schedule | None = None
    trace_obj: Trace | None = None
    sync_buffers = (
        options.broadcast_buffers if options.broadcast_buffers is not None else backend == "torch"
    )
    if schedule is None:
        plan = partition_params(infos, options.partition_bytes)
        mode = "online"
    else:
        refusal: InputError | None = None
        fell_back = False
        own_path: Literal["framework", "fallback"] | None = None
        try:
            loaded, where, trace_obj = _load(schedule, trace)
            if loaded.mode != want_mode:
                raise ScheduleMismatchError(
                    f"the schedule was compiled for the {loaded.mode} mode but the runtime runs "
                    f"the {want_mode} mode; recompile with `pace compile --mode {want_mode}` "
                    f"or wrap with sync={loaded.mode == 'sync'}",
                    where=where,
                    field="mode",
                )
            if loaded.framework is not None:
                # Argument-driven, so every rank raises; never a reason to fall back.
                refusal = _framework_refusal(loaded.framework, where, backend, drift)
                if refusal is not None:
                    raise refusal
            # Checked on the framework's path too: a schedule of another model is an error.
            plan = plan_from_schedule(loaded, infos, where=where)
        except InputError as err:
            if not fallback or err is refusal:
                raise
            warnings.warn(
                f"pace: cannot replay the schedule ({err}); falling back to plain "
                "data-parallel training",
                RuntimeWarning,
                stacklevel=2,
            )
            fell_back = True
            # Horovod's own optimizer is the plain data-parallel path there; torch gets WFBP.
            if backend == "horovod":
                own_path = "fallback"
            else:
                plan = wfbp_plan(infos)
        if loaded is not None and loaded.framework is not None and not fell_back:
            _warn_framework_path(loaded, where)
            own_path = "framework"
        if own_path is not None:
            return _horovod_path(
                optimizer,
                model,
                module,
                sync=options.sync,
                broadcast_buffers=sync_buffers,
                monitor=monitor,
                timeout_s=options.timeout_s,
                framework=own_path == "framework",
            )

    if drift is not False and (schedule is None or plan.source == "wfbp"):
        raise InputError(
            "drift re-planning needs a compiled schedule to re-plan (not the online mode or "
            "the fallback)",
            where="drift",
        )
    if drift is not False and trace_obj is None:
        raise InputError(
            "drift=True needs trace= (the trace the schedule was compiled from): the re-estimate "
            "scales its op durations and refits its link",
            where="drift",
        )
    if drift is not False and monitor is not None:
        raise InputError("pass either monitor= or drift=, not both", where="drift")
    be = make_backend(backend)
    reporter = Reporter(torch_board() if backend == "torch" else horovod_board(), be.rank, be.size)
    reporter.install_excepthook()
    # As DDP's constructor (and Horovod's documented broadcast_parameters): every rank starts
    # from rank 0's parameters and buffers.
    _broadcast_state(be, module)
    loop: DriftLoop | None = None
    if drift is not False and loaded is not None and trace_obj is not None:
        loop = DriftLoop(
            trace=trace_obj,
            schedule=loaded,
            param_names=tuple(names),
            rank=be.rank,
            broadcast_bytes=be.broadcast_bytes,
            options=drift if isinstance(drift, DriftOptions) else DriftOptions(),
        )
        monitor = loop.monitor
    base = type(optimizer)
    cls = cast(
        "type[PaceOptimizer]",
        type(base.__name__, (PaceOptimizer, base), {"__module__": base.__module__}),
    )
    wrapped = object.__new__(cls)
    state = {k: v for k, v in optimizer.__dict__.items() if k not in _OWN_METHODS}
    wrapped.__dict__.update(state)
    wrapped._pace_base = base
    wrapped._pace_params = params
    wrapped._pace_group_of = group_of
    wrapped._pace_snapshots = {}
    wrapped._pace_plan = plan
    wrapped._pace_infos = infos
    ref = weakref.ref(wrapped)

    def iteration_start(k: int) -> None:
        w = ref()
        if w is not None:
            w._pace_iteration_start(k)

    def update(indices: tuple[int, ...], k: int) -> None:
        w = ref()
        if w is None:
            raise RuntimeReplayError("the wrapped optimizer was garbage-collected mid-training")
        w._pace_update(indices, k)

    engine = Engine(
        params=params,
        infos=infos,
        plan=plan,
        backend=be,
        mode=mode,
        updater=update,
        on_iteration_start=iteration_start,
        credit_bytes=_credit_bytes(options, mode, be.in_order),
        timeout_s=options.timeout_s,
        inject_delay_s=options.inject_delay_s,
        seed=options.seed,
        monitor=monitor,
        sync=options.sync,
        # Each backend's reference: DDP (find_unused_parameters=True) or Horovod (zeros).
        unused="ddp" if backend == "torch" else "zero",
        reporter=reporter,
    )
    wrapped._pace_engine = engine
    wrapped._pace_drift = loop
    if loop is not None and options.sync:
        engine.after_close = wrapped._pace_after_close
    # GradScaler.step(opt) then calls opt.step(grad_scaler=...), which the overlapped mode
    # refuses; in the sync mode GradScaler unscales and steps as usual.
    wrapped._step_supports_amp_scaling = not options.sync
    # The overlapped mode's reads outside the owning module's forward wait at the read
    # (pace.runtime.reads): after step() and, for an eager model, inside the forward.
    guard = (
        None
        if options.sync
        else ReadGuard(params, [info.name for info in infos], engine.wait_updated, engine.pending)
    )
    wrapped._pace_guard = guard
    wrapped._pace_handles = _install_hooks(
        engine,
        model,
        module,
        params,
        guard=guard,
        per_module_waits=not compiled,
        buffers_from=be if sync_buffers else None,
    )
    if loop is not None:
        wrapped._pace_handles.extend(_monitor_hooks(engine, model, loop))
    # Threads must stop even if the user never calls close(): at collection or at exit (then
    # without waiting long for a collective that a dead peer will never finish).
    finalizer = weakref.finalize(wrapped, _close_all, engine, loop)
    atexit.register(finalizer)
    return wrapped


def _refuse_unreducible(named: list[tuple[str, torch.nn.Parameter]]) -> None:
    """Refuse, at wrap and on every rank (the parameters' types are the same on each), a model
    with a gradient Horovod cannot reduce; else Horovod's own ``ValueError`` comes from inside
    the first backward pass, on every rank, after the first iteration's forward."""
    bad = horovod_unreducible(named)
    if not bad:
        return
    kinds = sorted({kind for _, kind in bad})
    version = getattr(sys.modules.get("horovod"), "__version__", "(version unknown)")
    shown = ", ".join(repr(name) for name, _ in bad[:3])
    more = f" and {len(bad) - 3} more" if len(bad) > 3 else ""
    raise InputError(
        f"Horovod {version} cannot all-reduce {' or '.join(kinds)} "
        f"(parameters {shown}{more}); train with backend='torch' (torch.distributed reduces "
        "them), or keep these parameters in a dtype Horovod reduces (float32, float16)",
        where="backend",
    )


def _close_all(engine: Engine, loop: DriftLoop | None) -> None:
    engine.close(2.0)
    if loop is not None:
        loop.close()


def _monitor_hooks(engine: Engine, model: torch.nn.Module, loop: DriftLoop) -> list[Any]:
    """The drift monitor's forward and backward spans, from the training forward's ends."""
    started = [0.0, 0.0]  # perf_counter at the forward's start, blocked seconds then

    def pre(_m: torch.nn.Module, _args: Any) -> None:
        if torch.is_grad_enabled() and not engine.accumulating:
            started[0] = time.perf_counter()
            started[1] = engine.blocked_s

    def post(_m: torch.nn.Module, _args: Any, _out: Any) -> None:
        if torch.is_grad_enabled() and not engine.accumulating and started[0]:
            now = time.perf_counter()
            blocked = engine.blocked_s - started[1]
            loop.monitor.on_forward_compute(max(0.0, now - started[0] - blocked) * 1e6)
            # The backward pass starts right after the forward (the loss is negligible).
            loop.monitor.on_backward_start(now * 1e6)
            started[0] = 0.0

    return [model.register_forward_pre_hook(pre), model.register_forward_hook(post)]


def _broadcast_state(backend: Backend, module: torch.nn.Module) -> None:
    tensors = [p.data for p in module.parameters()] + list(module.buffers())
    with torch.no_grad():
        backend.broadcast_from_rank0(tensors, "pace.init")


def _install_hooks(
    engine: Engine,
    model: torch.nn.Module,
    module: torch.nn.Module,
    params: list[torch.nn.Parameter],
    *,
    guard: ReadGuard | None,
    per_module_waits: bool,
    buffers_from: Backend | None,
) -> list[Any]:
    """Gradient hooks; forward pre-hooks that wait for updates (overlapped mode: ``guard``
    given), per module or, where ``per_module_waits`` is off (a compiled model), once for all;
    DDP's buffer broadcast. ``model`` is what the user calls (maybe compiled), ``module`` its
    own module."""
    index = {id(p): i for i, p in enumerate(params)}
    device = params[0].device if params else torch.device("cpu")
    handles: list[Any] = [_stream_guard(engine, model, device)]
    for i, p in enumerate(params):

        def on_grad(_: torch.Tensor, i: int = i) -> None:
            engine.mark_ready(i)

        handles.append(p.register_post_accumulate_grad_hook(on_grad))  # type: ignore[no-untyped-call]
    if guard is not None and per_module_waits:
        # A parameter read before its own module's forward waits at that read (pace.runtime.reads).
        handles.append(model.register_forward_pre_hook(lambda _m, _args: guard.begin()))
        handles.append(
            model.register_forward_hook(lambda _m, _args, _out: guard.end(), always_call=True)
        )
        for mod_name, sub in module.named_modules():
            own = [index[id(p)] for p in sub.parameters(recurse=False) if id(p) in index]
            if not own:
                continue
            what = f"forward of {mod_name or type(sub).__name__!r}"

            def pre_forward(
                _m: torch.nn.Module, _args: Any, own: list[int] = own, what: str = what
            ) -> None:
                engine.wait_updated(own, what)
                guard.waited(own)

            handles.append(sub.register_forward_pre_hook(pre_forward))
    elif guard is not None:
        # A compiled module: one wait outside its graph, before it runs (a hook inside would
        # break the graph), for every parameter's update; the guard on since step() leaves
        # before the graph runs.
        def pre_forward_all(_m: torch.nn.Module, _args: Any) -> None:
            engine.wait_updated(range(len(params)), "forward of the compiled model")
            guard.release()

        handles.append(model.register_forward_pre_hook(pre_forward_all))
    if buffers_from is not None:
        handles.extend(
            _buffer_hooks(
                lambda: engine.accumulating, model, module, buffers_from.broadcast_from_rank0
            )
        )

    def before_state_dict(*_: Any) -> None:
        if not engine.iteration_open():
            engine.wait_updated(range(len(params)), "model.state_dict()")

    handles.append(model.register_state_dict_pre_hook(before_state_dict))  # type: ignore[no-untyped-call]
    return handles


def _on_default_stream(device: torch.device) -> bool:
    """Whether the calling thread's current CUDA stream on ``device`` is its default stream
    (always True off CUDA)."""
    if device.type != "cuda":
        return True
    return bool(torch.cuda.current_stream(device) == torch.cuda.default_stream(device))


def _stream_guard(engine: Engine, model: torch.nn.Module, device: torch.device) -> Any:
    """Refuse a forward on a side CUDA stream (``with torch.cuda.stream(s):``, CUDA graph
    capture): the runtime packs, reduces, copies back and updates on each of its threads'
    default streams, so it is ordered with a training step on the default stream only. On a
    side stream the backward's gradients could be read before they are written, and an
    overlapped update could land under a forward that reads the parameter."""

    def pre(_m: torch.nn.Module, _args: Any) -> None:
        # A forward without gradients on a side stream is the user's own business in the sync
        # mode (their optimizer.step() updates on their stream); in the overlapped mode the
        # runtime's updates may still be in flight on the default stream.
        if (torch.is_grad_enabled() or not engine.sync) and not _on_default_stream(device):
            engine.refuse(
                f"rank {engine.backend.rank}: the model's forward runs on a non-default CUDA "
                "stream; pace.runtime orders its reductions, copy-backs and updates with the "
                "default stream only, so gradients and parameters could be read before they "
                "are written. Run the training step on the default stream (outside "
                "torch.cuda.stream(...) and CUDA graph capture), or train this loop with DDP"
            )

    return model.register_forward_pre_hook(pre)


def _buffer_hooks(
    accumulating: Callable[[], bool],
    model: torch.nn.Module,
    module: torch.nn.Module,
    broadcast_from_rank0: Callable[[list[torch.Tensor], str], None],
) -> list[Any]:
    """DDP's ``broadcast_buffers=True``, to the same forwards: rank 0's buffers are copied at
    the start of a forward when the previous forward ran with gradients enabled and outside
    ``no_sync()`` (the first forward too); DDP's flag ``require_forward_param_sync``."""
    due = [True]

    def pre(_m: torch.nn.Module, _args: Any) -> None:
        buffers = list(module.buffers())
        if due[0] and buffers:
            # As DDP: the copy is not an in-place change autograd should see.
            with (
                torch.no_grad(),
                torch.autograd._unsafe_preserve_version_counter(  # type: ignore[attr-defined]
                    tuple(buffers)
                ),
            ):
                broadcast_from_rank0(buffers, "pace.buffers")

    def post(_m: torch.nn.Module, _args: Any, _out: Any) -> None:
        due[0] = torch.is_grad_enabled() and not accumulating()

    return [model.register_forward_pre_hook(pre), model.register_forward_hook(post)]


# --- the framework's own path (Horovod) --------------------------------------------------------

_FRAMEWORK_NAMES = {"horovod": "Horovod"}
# no_sync() on Horovod's path: Horovod all-reduces a gradient when its countdown
# (``_allreduce_delay``, reset to ``backward_passes_per_step`` by every synchronize) reaches
# zero; inside no_sync() the countdown starts here instead, so it never does.
_NO_SYNC_DELAY = 2**62


def _framework_refusal(
    framework: str, where: str, backend: str, drift: bool | DriftOptions
) -> InputError | None:
    """Why a schedule marked to train with ``framework``'s own path cannot run as asked."""
    name = _FRAMEWORK_NAMES.get(framework, framework)
    if backend != framework:
        return ScheduleMismatchError(
            f"the compiler chose {name}'s own data-parallel path for this job (predicted faster "
            f"than replaying the schedule's units), which backend={backend!r} cannot run; wrap "
            f"with backend={framework!r}, or recompile with `pace compile --no-framework` to "
            "replay the units",
            where=where,
            field="framework",
        )
    if framework != "horovod":  # pragma: no cover - FRAMEWORK_BACKENDS holds only "horovod"
        return ScheduleMismatchError(
            f"this runtime has no path for framework {framework!r}; recompile with "
            "`pace compile --no-framework` to replay the units",
            where=where,
            field="framework",
        )
    if drift is not False:
        return InputError(
            f"drift re-planning needs a replayed schedule, but {where} trains with {name}'s own "
            "data-parallel path (its framework field); recompile with `pace compile "
            "--no-framework` to replay the units, or wrap without drift=",
            where="drift",
        )
    return None


def _us_to_ms(value: Any) -> str | None:
    if isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value):
        return f"{value / 1e3:.1f} ms"
    return None


def _warn_framework_path(schedule: Schedule, where: str) -> None:
    name = _FRAMEWORK_NAMES.get(schedule.framework or "", schedule.framework)
    info = schedule.meta.get("framework")
    numbers = ""
    if isinstance(info, dict):
        fw, replay = _us_to_ms(info.get("predicted_iteration_us")), _us_to_ms(info.get("replay_us"))
        if fw is not None and replay is not None:
            numbers = f" ({fw} per iteration against {replay})"
    warnings.warn(
        f"pace: {where}: the compiler predicted {name}'s own data-parallel path "
        "(hvd.DistributedOptimizer, with tensor fusion and the response cache) faster for this "
        f"job than replaying the schedule's units{numbers}; training with it (`pace compile "
        "--no-framework` replays the units instead)",
        RuntimeWarning,
        stacklevel=3,
    )


@dataclass(slots=True)
class _HorovodPathState:
    """What the overrides on Horovod's optimizer share."""

    accumulating: bool = False  # inside no_sync()
    task: int = -1  # the backward pass (autograd graph task) that queued the end-of-backward


def _pending(opt: Any) -> bool:
    """Horovod's optimizer has reductions in flight (a backward's hooks issued them)."""
    return any(handle is not None for handle, _ in opt._handles.values())


def _polled(hvd: Any, handle: int) -> bool:
    return bool(hvd.poll(handle))


def _wait_in_flight(hvd: Any, opt: Any, timeout_s: float, name: Callable[[Any], str]) -> None:
    """Until every reduction Horovod's optimizer has in flight is done, polling with sleeps
    (``wait_polling``), all within ``timeout_s``; the handles stay Horovod's to install."""
    deadline = time.monotonic() + timeout_s
    for key, (handle, _) in list(opt._handles.items()):
        if handle is None:
            continue
        try:
            wait_polling(functools.partial(_polled, hvd, handle), deadline)
        except CollectiveTimeoutError as exc:
            raise RuntimeReplayError(
                f"rank {hvd.rank()}: Horovod's all-reduce of {name(key)} did not complete "
                f"within {timeout_s:g} s ({exc}); another rank is stuck, dead or training "
                "another model"
            ) from exc


def _horovod_path(
    optimizer: torch.optim.Optimizer,
    model: torch.nn.Module,
    module: torch.nn.Module,
    *,
    sync: bool,
    broadcast_buffers: bool,
    monitor: RuntimeMonitor | None,
    timeout_s: float,
    framework: bool = False,
) -> torch.optim.Optimizer:
    """Horovod's own data-parallel path: ``hvd.DistributedOptimizer`` (the fallback for a
    schedule that cannot be replayed, and a schedule's ``framework="horovod"``).

    Exactly the user's own Horovod loop, rank 0's parameters and buffers broadcast then
    ``hvd.DistributedOptimizer(optimizer, named_parameters=...)``, under the Horovod settings in
    force (fusion and cache as the environment says; pace's are not imposed), with pace's
    surface around it, on Horovod's optimizer instance (its class calls ``super(self.__class__,
    self)``, so it cannot be subclassed):

    - ``sync=True``: pace's promise that ``backward()`` returns with every gradient reduced
      (DDP's), so clipping and ``GradScaler`` work unchanged: the iteration's first gradient
      hook queues Horovod's ``synchronize()`` at the end of the backward pass;
    - ``step()`` and ``synchronize()`` never reduce again what is already reduced (Horovod's
      ``synchronize()`` with nothing in flight reduces every gradient again, and its
      ``step()`` after one warns and does so);
    - ``no_sync()``: backward passes inside accumulate locally; ``step()`` inside is refused;
    - ``broadcast_buffers=True``: rank 0's buffers copied as DDP's; ``close()`` does nothing;
    - the wait for the reductions in flight sleeps between polls (``wait_polling``) where
      Horovod's spins, then Horovod's ``synchronize()`` installs the results (the same calls,
      the same bits); one longer than ``timeout_s`` raises ``RuntimeReplayError`` naming the
      rank and the gradient, where Horovod's would wait for ever.
    """
    hvd = import_horovod()
    if not hvd.is_initialized():
        hvd.init()  # under the environment as it is: Horovod's defaults unless the user set them
    if framework:
        off = {k: v for k, v in HOROVOD_ENV.items() if os.environ.get(k) == v}
        if off:
            warnings.warn(
                f"pace: Horovod runs with {off} (the settings the replay needs), so its own "
                "data-parallel path runs without tensor fusion or the response cache, which "
                "the compiler's prediction for it assumed on (results are unchanged); leave "
                "these variables unset before hvd.init(), or let wrap call it",
                RuntimeWarning,
                stacklevel=3,
            )
    if monitor is not None:
        warnings.warn(
            "pace: monitor= gets no events on Horovod's own data-parallel path: it has no "
            "schedule units to report",
            RuntimeWarning,
            stacklevel=3,
        )
    in_optimizer = {id(p) for group in optimizer.param_groups for p in group["params"]}
    named = [(n, p) for n, p in module.named_parameters() if id(p) in in_optimizer]
    if len(named) != len(in_optimizer):
        raise InputError(
            f"{len(in_optimizer) - len(named)} parameter(s) of the optimizer are not parameters "
            "of the model",
            where="wrap",
        )
    # As the replay's wrap (and Horovod's documented broadcast_parameters(state_dict)): every
    # rank starts from rank 0's parameters and buffers.
    with torch.no_grad():
        horovod_broadcast_from_rank0(
            hvd, [p.data for p in module.parameters()] + list(module.buffers()), "pace.init"
        )
    opt = hvd.DistributedOptimizer(optimizer, named_parameters=named)
    cls = type(opt)
    state = _HorovodPathState()

    def step(self: Any, closure: Callable[[], float] | None = None) -> Any:
        if state.accumulating:
            raise RuntimeReplayError(
                "step() inside no_sync(): the gradients accumulated there are not reduced yet; "
                "run the last backward() outside no_sync(), then step()"
            )
        if not self._should_synchronize:  # inside the user's skip_synchronize()
            return cls.step(self, closure)
        if _pending(self):
            # Horovod's step() waits for them. A synchronize() before this backward (then a
            # step skipped, as GradScaler does on an inf) is stale: no warning for it.
            self._synchronized = False
            return cls.step(self, closure)
        if not self._synchronized:
            return cls.step(self, closure)  # nothing reduced yet: Horovod's own
        # Reduced already (at the end of backward in the sync mode, or by the user's
        # synchronize()): Horovod's step() would warn and reduce every gradient again.
        self._should_synchronize = False
        try:
            return cls.step(self, closure)
        finally:
            self._should_synchronize = True

    name_of = {id(p): n for n, p in named}

    def synchronize(self: Any) -> None:
        """Wait for the reductions in flight and install their results (Horovod's); nothing
        to do when none is in flight (Horovod's would reduce every gradient again)."""
        if _pending(self):
            _wait_in_flight(hvd, self, timeout_s, lambda key: name_of.get(id(key), "a group"))
            cls.synchronize(self)

    @contextlib.contextmanager
    def no_sync(self: Any) -> Iterator[None]:
        """DDP's ``no_sync()``: backward passes inside accumulate gradients locally, with no
        communication; the next backward outside reduces the accumulated gradients."""
        if state.accumulating:
            yield
            return
        if _pending(self):
            raise RuntimeReplayError(
                "no_sync() entered while the gradients of a backward() outside it are still "
                "being reduced: call step() (or synchronize()) first"
            )
        delays = dict(self._allreduce_delay)
        for p in delays:
            self._allreduce_delay[p] = _NO_SYNC_DELAY
        state.accumulating = True
        try:
            yield
        finally:
            state.accumulating = False
            # Horovod's hooks left (None, None) for each gradient they did not reduce.
            for key in [k for k, (handle, _) in self._handles.items() if handle is None]:
                del self._handles[key]
            self._allreduce_delay.update(delays)

    def close(self: Any) -> None:
        """Nothing to stop (Horovod's lifetime is the user's): the replay's surface."""

    opt.step = types.MethodType(step, opt)  # a method: LR schedulers wrap step.__func__
    opt.synchronize = types.MethodType(synchronize, opt)
    opt.no_sync = types.MethodType(no_sync, opt)
    opt.close = types.MethodType(close, opt)
    if sync:
        ref = weakref.ref(opt)

        def end_of_backward() -> None:
            o = ref()
            if o is not None:
                synchronize(o)

        def on_grad(_: torch.Tensor) -> None:
            if state.accumulating:
                return
            task = torch._C._current_graph_task_id()
            if task != state.task:
                # Runs when this backward pass ends, after every hook of it (Horovod's too):
                # backward() returns with every gradient reduced, as DDP's (same callback).
                state.task = task
                torch.autograd.Variable._execution_engine.queue_callback(end_of_backward)

        # The hooks live as long as the parameters, as Horovod's own (close() is a no-op).
        for _, p in named:
            if p.requires_grad:
                p.register_post_accumulate_grad_hook(on_grad)  # type: ignore[no-untyped-call]
    if broadcast_buffers:
        _buffer_hooks(
            lambda: state.accumulating,
            model,
            module,
            lambda tensors, name: horovod_broadcast_from_rank0(hvd, tensors, name),
        )
    return cast(torch.optim.Optimizer, opt)


def wrapped_params(optimizer: torch.optim.Optimizer) -> Iterable[torch.nn.Parameter]:
    """The parameters the runtime reduces and updates (for tests and tools)."""
    if isinstance(optimizer, PaceOptimizer):
        return list(optimizer._pace_params)
    return [p for g in optimizer.param_groups for p in g["params"]]
