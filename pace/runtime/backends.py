"""Collective backends: Horovod (``horovod.torch.mpi_ops``) and ``torch.distributed``.

A backend starts an in-place all-reduce of a contiguous tensor and waits for it with a time
limit. Each backend averages as the framework it replaces does, so the bits are that framework's:
Horovod's ``op=Average`` sums, then multiplies by ``1 / size`` (its ``postscale_factor``,
``sum_scale``); DDP multiplies each gradient by ``1 / size`` while copying it into its bucket,
then sums, so with ``torch.distributed`` the runtime multiplies by the backend's ``pre_scale``
while packing a unit and the reduction is a plain sum. The two differ where a halved value
rounds (subnormals: common in float16 gradients).
"""

from __future__ import annotations

import contextlib
import itertools
import os
import time
import warnings
from collections.abc import Callable, Sequence
from datetime import timedelta
from typing import Any, Protocol

import torch

from pace.errors import InputError
from pace.options import HOROVOD_RUNTIME_ENV

# Horovod negotiates every collective in cycles; with tensor fusion or the response cache on it
# may regroup or reorder what we issue. These are read once, by hvd.init().
HOROVOD_ENV = HOROVOD_RUNTIME_ENV

# Polling back-off for Horovod handles: Horovod's own wait spins (yield + GIL re-acquire), which
# on a 2-core machine steals the CPU the backward pass needs.
_POLL_MIN_S = 20e-6
_POLL_MAX_S = 1e-3


# DDP's broadcast_bucket_size default (250 MiB).
_BROADCAST_BUCKET_BYTES = 250 * 2**20


class CollectiveTimeoutError(TimeoutError):
    """A collective did not finish within the time limit."""


class Backend(Protocol):
    name: str
    rank: int
    size: int
    # True when collectives run one after another, in the order they were started (one
    # executor): a replay then issues each unit as soon as its gradients are ready and the
    # backend starts it the moment the previous one ends, with no Python thread in between.
    # False: started collectives may run side by side, so a replay issues one at a time.
    in_order: bool

    # The average of gradients g_r is pre_scale * sum_r(g_r) * sum_scale, each factor applied
    # where the replaced framework applies it. ``pre_scale``: what the caller multiplies each
    # gradient by before the reduction (DDP's 1 / size, while packing: one pass over the bytes
    # with the pack's copy); ``sum_scale``: what the reduction multiplies its sum by (Horovod's
    # op=Average: 1 / size). The other is 1.0. Values the caller appends unscaled (readiness
    # and used maps: 0 or 1 per rank) come back as their sum times ``sum_scale``.
    pre_scale: float
    sum_scale: float

    def start(self, buf: torch.Tensor, name: str) -> Any:
        """Start an in-place all-reduce of contiguous ``buf`` (its sum times ``sum_scale``);
        returns a handle."""
        ...

    def wait(self, handle: Any, timeout_s: float) -> None:
        """Wait for ``handle``: its buffer then holds the reduction. Raise
        ``CollectiveTimeoutError`` or the backend's error."""
        ...

    def broadcast_from_rank0(self, tensors: list[torch.Tensor], name: str) -> None:
        """Copy rank 0's values of ``tensors`` into every rank's, in place, from the caller's
        thread (the training thread: ordered with the user's own collectives, as DDP's)."""
        ...

    def broadcast_bytes(self, payload: bytes | None) -> bytes:
        """Rank 0's ``payload`` on every rank (others pass None), from the training thread."""
        ...

    def close(self) -> None: ...


def import_horovod() -> Any:
    """``horovod.torch``, or an ``InputError`` saying how to get it."""
    try:
        import horovod.torch as hvd
    except ImportError as exc:  # pragma: no cover - depends on the machine
        raise InputError(
            f"horovod.torch is not importable; build it with scripts/install_horovod.sh ({exc})",
            where="backend",
        ) from exc
    return hvd


def horovod_unreducible(named: Sequence[tuple[str, torch.Tensor]]) -> list[tuple[str, str]]:
    """The (name, tensor type) of each tensor in ``named`` that this Horovod build cannot
    all-reduce, by Horovod's own table: ``horovod.torch.mpi_ops`` looks up one C function per
    tensor type and raises ``ValueError('Tensor type ... is not supported.')`` at the first
    reduction of a type it lacks (0.28 on the CPU: bfloat16, bool, uint8, complex). Empty
    where this Horovod does not expose that table (it then says so itself, later)."""
    mpi_ops = import_horovod().mpi_ops
    factory = getattr(mpi_ops, "_allreduce_function_factory", None)
    lib = getattr(mpi_ops, "mpi_lib", None)
    if factory is None or lib is None:  # pragma: no cover - another Horovod's internals
        return []
    return [(name, t.type()) for name, t in named if not hasattr(lib, factory(t))]


def wait_polling(done: Callable[[], bool], deadline: float) -> None:
    """Until ``done()``, sleeping between polls (20 us, doubling to 1 ms): the thread gives
    its core away while it waits. Horovod 0.28's own wait (``synchronize``) spins on
    ``std::this_thread::yield()``, taking the GIL back each turn: measured on the throttled
    link, a training thread waiting in it used a core for the whole wait (2338 core-ms per
    iteration on two ranks against 994 with nothing to wait for). ``deadline``:
    ``time.monotonic()``'s; past it, ``CollectiveTimeoutError``."""
    start = time.monotonic()
    pause = _POLL_MIN_S
    while not done():
        now = time.monotonic()
        if now > deadline:
            raise CollectiveTimeoutError(f"not finished after {now - start:.3g} s")
        time.sleep(pause)
        pause = min(_POLL_MAX_S, pause * 2)


def horovod_wait(mpi_ops: Any, handle: Any, timeout_s: float) -> None:
    """Wait for a Horovod collective's ``handle`` without spinning a core
    (``wait_polling``); raise ``CollectiveTimeoutError`` past ``timeout_s``, or Horovod's error
    if the collective failed."""
    wait_polling(lambda: bool(mpi_ops.poll(handle)), time.monotonic() + timeout_s)
    # Returns at once now; raises HorovodInternalError if the collective failed.
    mpi_ops.synchronize(handle)


def horovod_broadcast_from_rank0(hvd: Any, tensors: list[torch.Tensor], name: str) -> None:
    """Copy rank 0's values of ``tensors`` into every rank's, in place, through Horovod."""
    # One collective per dtype: flatten, broadcast, copy back (bitwise a copy).
    by_dtype: dict[tuple[torch.dtype, torch.device], list[torch.Tensor]] = {}
    for t in tensors:
        if t.numel():
            by_dtype.setdefault((t.dtype, t.device), []).append(t)
    for n, group in enumerate(by_dtype.values()):
        flat = torch.cat([t.reshape(-1) for t in group])
        hvd.broadcast_(flat, root_rank=0, name=f"{name}.{n}")
        at = 0
        for t in group:
            t.copy_(flat[at : at + t.numel()].view_as(t))
            at += t.numel()


class HorovodBackend:
    """``horovod.torch.mpi_ops.allreduce_async_`` with ``op=Average``, fusion and cache off."""

    name = "horovod"
    pre_scale = 1.0  # op=Average multiplies the sum by 1 / size itself (its postscale)

    def __init__(self) -> None:
        hvd = import_horovod()
        from horovod.torch import mpi_ops

        if not hvd.is_initialized():
            for key, value in HOROVOD_ENV.items():
                os.environ.setdefault(key, value)
            hvd.init()
        bad = {k: os.environ.get(k) for k, v in HOROVOD_ENV.items() if os.environ.get(k) != v}
        if bad:
            warnings.warn(
                f"Horovod runs with {bad} (pace needs "
                f"{HOROVOD_ENV}): Horovod may regroup or reorder the scheduled all-reduces; "
                "results are unchanged. Set these variables before hvd.init().",
                RuntimeWarning,
                stacklevel=3,
            )
        self._hvd = hvd
        self._mpi_ops = mpi_ops
        self.rank = int(hvd.rank())
        self.size = int(hvd.size())
        self.sum_scale = 1.0 / self.size
        # Horovod's background thread executes the negotiated collectives one by one, in the
        # order every rank issued them, unless fusion or the response cache regroups them.
        self.in_order = not bad

    def start(self, buf: torch.Tensor, name: str) -> Any:
        return self._mpi_ops.allreduce_async_(buf, name=name, op=self._mpi_ops.Average)

    def wait(self, handle: Any, timeout_s: float) -> None:
        horovod_wait(self._mpi_ops, handle, timeout_s)

    def broadcast_from_rank0(self, tensors: list[torch.Tensor], name: str) -> None:
        horovod_broadcast_from_rank0(self._hvd, tensors, name)

    def broadcast_bytes(self, payload: bytes | None) -> bytes:
        out = self._hvd.broadcast_object(payload, root_rank=0, name="pace.drift.switch")
        return bytes(out) if out else b""

    def close(self) -> None:
        """Horovod's lifetime belongs to the user (hvd.shutdown)."""


class TorchBackend:
    """An averaging all-reduce on a process group of its own.

    A dedicated group keeps the user's own collectives (metrics, barriers) on the default group
    from interleaving with ours: two threads issuing on one group would break the identical
    order every rank must see. With gloo the group has one worker thread (torch's default is
    two, which run two started collectives side by side on the link), so it runs collectives in
    issue order (``in_order``); NCCL runs a group's collectives in order on one stream.
    """

    name = "torch"

    def __init__(self) -> None:
        import torch.distributed as dist

        if not dist.is_available() or not dist.is_initialized():
            raise InputError(
                "torch.distributed is not initialised; call "
                "torch.distributed.init_process_group() before pace.runtime.wrap()",
                where="backend",
            )
        self._dist = dist
        self.rank = int(dist.get_rank())
        self.size = int(dist.get_world_size())
        # DDP's reducer multiplies each gradient by 1 / size as it copies it into a bucket
        # (``mul_out``), then sums: the same multiply before the same kind of sum.
        self.pre_scale = 1.0 / self.size
        self.sum_scale = 1.0
        kind = str(dist.get_backend()).lower()
        self._nccl = "nccl" in kind
        self._gloo: Any = None
        self._group: Any = None
        if "gloo" in kind and not self._nccl:
            self._gloo = _serial_gloo_group(dist, timeout_s=GROUP_TIMEOUT_S)
        if self._gloo is None:
            # Collective: every rank calls wrap(), so every rank creates the group here.
            group = dist.new_group(backend=dist.get_backend())
            assert isinstance(group, dist.ProcessGroup)  # a member: never the sentinel
            self._group = group
        self.in_order = self._nccl or self._gloo is not None

    def start(self, buf: torch.Tensor, name: str) -> Any:
        if self._gloo is not None:
            return (self._gloo.allreduce([buf]), buf)
        work = self._dist.all_reduce(buf, group=self._group, async_op=True)
        return (work, buf)

    def wait(self, handle: Any, timeout_s: float) -> None:
        work, buf = handle
        if self._nccl and buf.is_cuda:
            # Stream-ordered, as DDP's: the caller's current stream waits for NCCL's, and the
            # scaling, the copy-back and the update it launches next run after the reduction
            # on the device, while the host goes on. A wait with a time limit would block this
            # thread until the GPU finished, so the updates (and through the forward's waits,
            # the next forward) could not be queued ahead: the host would stall the device
            # once per unit (measured: +40% per iteration on ResNet-50, docs/gpu.md). NCCL's
            # own watchdog enforces the process group's timeout instead.
            work.wait()
            return
        try:
            work.wait(timeout=timedelta(seconds=timeout_s))
        except RuntimeError as exc:
            if "timed out" in str(exc).lower() or "timeout" in str(exc).lower():
                raise CollectiveTimeoutError(str(exc).splitlines()[0]) from exc
            raise

    def broadcast_from_rank0(self, tensors: list[torch.Tensor], name: str) -> None:
        # DDP's own coalesced broadcast on the default group (as DDP: its process group).
        live = [t for t in tensors if t.numel()]
        if live:
            self._dist._broadcast_coalesced(  # type: ignore[attr-defined]
                self._dist.distributed_c10d._get_default_group(), live, _BROADCAST_BUCKET_BYTES, 0
            )

    def broadcast_bytes(self, payload: bytes | None) -> bytes:
        # The default group, from the training thread: ordered with the user's own collectives
        # (this runs inside step() or backward(), at the same point on every rank).
        box: list[Any] = [payload]
        self._dist.broadcast_object_list(box, src=0)
        return bytes(box[0]) if box[0] else b""

    def close(self) -> None:
        # Best effort at shutdown: the default group may already be destroyed.
        if self._group is not None:
            with contextlib.suppress(Exception):
                self._dist.destroy_process_group(self._group)
        self._gloo = None  # its connections close with the object


# The one-thread gloo group's time-out for its own operations; the runtime's waits carry
# their own (RuntimeOptions.timeout_s), so this only bounds a wait nobody times.
GROUP_TIMEOUT_S = 1800.0
_SERIAL_GROUPS = itertools.count()


def _serial_gloo_group(dist: Any, *, timeout_s: float) -> Any:
    """A gloo process group with one worker thread, on the default group's store and network
    interfaces (``GLOO_SOCKET_IFNAME``, as torch reads it), or None when this torch does not
    offer the pieces (then the caller falls back to ``new_group`` and one unit at a time).

    Collective: every rank creates its groups in the same order, so the store prefixes match.
    """
    try:
        gloo = dist.ProcessGroupGloo
        options = gloo._Options()
        names = [n for n in os.environ.get("GLOO_SOCKET_IFNAME", "").split(",") if n]
        options._devices = (
            [gloo.create_device(interface=n) for n in names]
            if names
            else [gloo.create_default_device()]
        )
        options._threads = 1
        options._timeout = timedelta(seconds=timeout_s)
        store = dist.PrefixStore(
            f"pace.serial.{next(_SERIAL_GROUPS)}", dist.distributed_c10d._get_default_store()
        )
        return gloo(store, dist.get_rank(), dist.get_world_size(), options)
    except (AttributeError, TypeError) as exc:  # a torch without these private pieces
        warnings.warn(
            f"pace: cannot build a one-thread gloo group ({exc}); the replay sends one unit at "
            "a time instead",
            RuntimeWarning,
            stacklevel=4,
        )
        return None


def make_backend(name: str) -> Backend:
    if name == "horovod":
        return HorovodBackend()
    if name == "torch":
        return TorchBackend()
    raise InputError(f"unknown backend {name!r}; choose 'horovod' or 'torch'", where="backend")
