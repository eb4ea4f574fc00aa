"""The one IR that flows through pace's stages.

``Trace`` (profiler output, compiler input) -> ``FusionPlan`` (fusion output) -> ``Schedule``
(scheduler output, runtime input). All types are frozen so a stage can never change what an
earlier stage produced; a stage that wants a different trace builds a new one with
``dataclasses.replace``.

Field names carry units (``_us``, ``_bytes``). The JSON keys of the file formats
(docs/trace-format.md, docs/schedule-format.md: ``bytes``, ``offset``) are mapped to these names
by ``pace.io`` only. Stages, import rules and contracts: docs/design.md.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from pace.options import PHASES, SCHEDULE_MODES, Phase, ScheduleMode

# The op phases and schedule modes are defined in pace.options (every option set in one place)
# and re-exported here, where most modules have always imported them from.
__all__ = [
    "DTYPE_ELEMENT_BYTES",
    "PHASES",
    "SCHEDULE_MODES",
    "CommModel",
    "FrameworkPath",
    "FusionPlan",
    "Interference",
    "Op",
    "Phase",
    "Schedule",
    "ScheduleMode",
    "Slice",
    "Tensor",
    "Trace",
    "Unit",
]


@dataclass(frozen=True, kw_only=True, slots=True)
class Op:
    """One computation op of the iteration window."""

    name: str
    phase: Phase
    duration_us: float
    deps: tuple[str, ...] = ()


@dataclass(frozen=True, kw_only=True, slots=True)
class Tensor:
    """One gradient tensor to all-reduce.

    Ready when ``producer`` finishes; each op in ``consumers`` may start only after the
    tensor's all-reduce completes. ``element_bytes`` is the size of one element (4 for float32):
    a partition of the tensor must start and end on an element boundary, since the runtime
    all-reduces whole elements. 1 means unknown (any byte boundary). ``dtype`` is the
    gradient's dtype as torch names it (``"float16"``, ``"bfloat16"``; ``""``: not recorded):
    the runtime all-reduces a fused unit as one buffer of one dtype, so only tensors of one
    ``fusion_kind`` may share a unit, and two dtypes of one element size (float16 and
    bfloat16) can be told apart only by it.
    """

    name: str
    size_bytes: int
    producer: str
    consumers: tuple[str, ...] = ()
    element_bytes: int = 1
    dtype: str = ""

    @property
    def fusion_kind(self) -> tuple[int, str]:
        """What tensors sharing a fused unit must have in common: element size and dtype (a
        tensor whose dtype is not recorded is of another kind than one whose dtype is)."""
        return (self.element_bytes, self.dtype)


DTYPE_ELEMENT_BYTES: Mapping[str, int] = {
    "float64": 8, "float32": 4, "float16": 2, "bfloat16": 2,
    "float8_e4m3fn": 1, "float8_e5m2": 1, "float8_e4m3fnuz": 1, "float8_e5m2fnuz": 1,
    "complex128": 16, "complex64": 8, "complex32": 4,
    "int64": 8, "int32": 4, "int16": 2, "int8": 1, "uint8": 1, "bool": 1,
}  # fmt: skip
"""The element size of each dtype torch names (``str(torch.float16)`` without ``torch.``): a
trace's tensor whose ``dtype`` is one of these must have this ``element_bytes``. Other names are
accepted as given (a dtype newer than this table), compared by name only."""


MAX_COMPUTE_LOSS = 0.95
"""Compute never loses more than this fraction of its progress to communication."""


@dataclass(frozen=True, kw_only=True, slots=True)
class Interference:
    """How much computation slows down beside communication (trace format: ``comm.interference``).

    Where compute and communication share processors (CPU ranks: gloo's threads, the kernel's
    TCP path; a GPU's SMs running NCCL kernels), an all-reduce in flight takes progress from
    the ops running at the same time. While a call of ``b`` bytes holds the channel for ``d`` us,
    concurrent computation loses ``us_per_call + us_per_byte * b`` us of progress, spread evenly
    over ``d`` (so it runs at ``1 - loss / d`` of its speed, never below ``1 -
    MAX_COMPUTE_LOSS``). ``idle_loss`` is the fraction lost with no call in flight (a backend's
    background loop polling). The other way round, a call progresses at ``1 / (1 +
    comm_stretch)`` of its speed while any op computes (the cores that move the bytes are busy),
    and a call issued while ops compute takes ``comm_us_per_call`` longer (its threads wait for
    a core, or for the interpreter lock, to issue and complete it; on Horovod's cycle channel
    once per cycle, whose calls run back to back on one thread).
    ``samples`` are the measured ``(bytes per call, loss fraction)`` points the fit came from.
    """

    us_per_byte: float = 0.0
    us_per_call: float = 0.0
    idle_loss: float = 0.0
    comm_stretch: float = 0.0
    comm_us_per_call: float = 0.0
    samples: tuple[tuple[int, float], ...] = ()

    def compute_loss(self, calls: Iterable[tuple[float, float]] = ()) -> float:
        """Fraction of compute progress lost while ``calls``, ``(bytes, us it takes)`` each, are
        in flight (none: idle)."""
        loss = self.idle_loss
        for size_bytes, duration_us in calls:
            if duration_us > 0:
                loss += (self.us_per_call + self.us_per_byte * size_bytes) / duration_us
        return min(MAX_COMPUTE_LOSS, max(0.0, loss))

    def alone_us(self, beside_us: float) -> float:
        """The time alone of a call that took ``beside_us`` beside compute all along: the
        inverse of ``(1 + comm_stretch) * alone + comm_us_per_call``."""
        return max(0.0, (beside_us - self.comm_us_per_call) / (1.0 + self.comm_stretch))

    @property
    def active(self) -> bool:
        return (
            self.us_per_byte > 0
            or self.us_per_call > 0
            or self.idle_loss > 0
            or self.comm_stretch > 0
            or self.comm_us_per_call > 0
        )


FRAMEWORK_POLICIES = {"horovod": "horovod"}
"""Per framework whose own data-parallel path the compiler can weigh and the runtime can train
with (``FrameworkPath``), the simulator policy that describes that path."""
FRAMEWORK_BACKENDS = tuple(FRAMEWORK_POLICIES)


@dataclass(frozen=True, kw_only=True, slots=True)
class FrameworkPath:
    """The framework's own data-parallel path on this link (trace format: ``comm.framework``).

    For ``backend="horovod"``: ``hvd.DistributedOptimizer`` under Horovod's defaults (tensor
    fusion and the response cache on), which the simulator's ``horovod`` policy describes
    (``FRAMEWORK_POLICIES``: one fused call per cycle, every gradient reduced before the
    optimizer steps on the training thread). Its calls cost ``alpha_us + beta_us_per_byte *
    bytes``, measured under those defaults, not under the runtime's settings (fusion and cache
    off, which the replay needs): with the response cache a call skips most of Horovod's
    negotiation. ``interference``: what
    those calls cost compute beside them (``None``: the trace's own term).

    Where the compiled schedule is predicted slower than this path, the compiler ships the
    schedule marked ``Schedule.framework`` and the runtime trains with the framework's path.
    """

    backend: str
    alpha_us: float
    beta_us_per_byte: float
    interference: Interference | None = None


@dataclass(frozen=True, kw_only=True, slots=True)
class CommModel:
    """Cost of one all-reduce call: ``alpha_us + beta_us_per_byte * bytes``.

    ``samples`` are the measured ``(bytes, us)`` points the model was fitted on, if any.
    ``interference``: what communication costs the computation beside it (``None``: nothing,
    as a GPU and a NIC that share nothing).
    ``update_us_per_byte``: what updating a reduced gradient costs before the forward may use
    its parameter, per byte of gradient. pace's overlapped runtime steps the optimizer on each
    parameter once its reduction completes, on one background thread, one unit after the other:
    the forward that needs the parameter waits for that update. 0: the update is free (or runs
    after a barrier, outside the replayed window, as a framework's ``optimizer.step()``).
    ``copy_us_per_byte``: what pace's runtime takes to copy a fused unit's reduced buffer back
    into its gradients, per byte of the unit, on the thread that completes units, before their
    update (a unit of one piece is reduced in place and copies nothing). Both modes pay it: the
    overlapped forward and the synchronous ``backward()``'s return wait for it. 0: free.
    ``framework``: the framework's own path on the same link, where measured (``FrameworkPath``).
    ``batched_alpha_us`` (Horovod): what a call costs beyond its bytes when Horovod negotiated
    it in the same cycle as an earlier call. Its background thread negotiates every tensor
    submitted since its last cycle in one round, then reduces them back to back, so only the
    cycle's first call pays the whole ``alpha_us``. Measured as the share of a lone call that a
    further one in a batch adds (``pace profile-comm --backend horovod``,
    ``pace.profiler.comm.with_batches``) times ``alpha_us``; charged by the simulator's cycle
    channel (the ``horovod`` policy). ``None``: not measured, every call costs ``alpha_us``.
    """

    workers: int
    alpha_us: float
    beta_us_per_byte: float
    algorithm: str = "ring"
    samples: tuple[tuple[int, float], ...] = ()
    interference: Interference | None = None
    update_us_per_byte: float = 0.0
    copy_us_per_byte: float = 0.0
    framework: FrameworkPath | None = None
    batched_alpha_us: float | None = None

    def cost_us(self, size_bytes: float) -> float:
        """Duration of one all-reduce call carrying ``size_bytes`` bytes."""
        return self.alpha_us + self.beta_us_per_byte * size_bytes

    def batched_cost_us(self, size_bytes: float) -> float:
        """Duration of a call negotiated in the same cycle as an earlier one
        (``batched_alpha_us``; ``cost_us`` where that was not measured). Never more than a lone
        call: a model whose ``alpha_us`` was lowered after the batches were measured (a
        calibration) keeps the lower of the two."""
        alpha = self.alpha_us
        if self.batched_alpha_us is not None:
            alpha = min(alpha, self.batched_alpha_us)
        return alpha + self.beta_us_per_byte * size_bytes


@dataclass(frozen=True, kw_only=True, slots=True)
class Trace:
    """One steady-state iteration window: backward of iteration k + forward of iteration k+1."""

    model: str
    ops: tuple[Op, ...]
    tensors: tuple[Tensor, ...]
    comm: CommModel
    meta: Mapping[str, Any] = field(default_factory=dict, compare=False, hash=False)

    def op_map(self) -> dict[str, Op]:
        return {op.name: op for op in self.ops}

    def tensor_map(self) -> dict[str, Tensor]:
        return {t.name: t for t in self.tensors}

    @property
    def total_bytes(self) -> int:
        return sum(t.size_bytes for t in self.tensors)


@dataclass(frozen=True, kw_only=True, slots=True)
class FusionPlan:
    """A partition of the trace's tensors into fusion groups.

    Each group is all-reduced as one flat buffer: it is ready when its last tensor is produced,
    and every consumer of any member waits for the whole group. ``groups`` are listed in the
    ready-time chain order; every tensor of the trace is in exactly one group. A plan with one
    tensor per group means "no fusion".
    """

    groups: tuple[tuple[str, ...], ...]
    method: str = "none"
    details: Mapping[str, Any] = field(default_factory=dict, compare=False, hash=False)

    @staticmethod
    def singletons(trace: Trace) -> FusionPlan:
        """The no-fusion plan: every tensor alone, in trace order."""
        return FusionPlan(groups=tuple((t.name,) for t in trace.tensors), method="none")


@dataclass(frozen=True, kw_only=True, slots=True)
class Slice:
    """The contiguous byte range ``[offset_bytes, offset_bytes + size_bytes)`` of one tensor."""

    tensor: str
    offset_bytes: int
    size_bytes: int


@dataclass(frozen=True, kw_only=True, slots=True)
class Unit:
    """One all-reduce call: the slices it carries, issued in ascending ``priority``."""

    priority: float
    slices: tuple[Slice, ...]

    @property
    def size_bytes(self) -> int:
        return sum(s.size_bytes for s in self.slices)

    @property
    def tensors(self) -> tuple[str, ...]:
        """Distinct tensor names in slice order."""
        return tuple(dict.fromkeys(s.tensor for s in self.slices))

    @property
    def fused(self) -> bool:
        """Carries several slices: pace's runtime packs them into one buffer and copies the
        result back (``CommModel.copy_us_per_byte``); a unit of one slice is reduced in place."""
        return len(self.slices) > 1


@dataclass(frozen=True, kw_only=True, slots=True)
class Schedule:
    """A compiled communication schedule (schedule format v1)."""

    trace_digest: str
    cost_model: CommModel
    units: tuple[Unit, ...]
    predicted_iteration_us: float
    mode: ScheduleMode = "overlap"
    # Compiled for the trace's computation this many times faster (``pace compile
    # --compute-speedup``): every replay re-applies it. In the file: meta.compute_speedup.
    compute_speedup: float | None = None
    # Set (to a ``FRAMEWORK_BACKENDS`` name) where the compiler predicted the framework's own
    # path faster than these units (``FrameworkPath``): the runtime trains with that path, and
    # the units stay for inspection. In the file: top-level ``framework``.
    framework: str | None = None
    # True: ``predicted_iteration_us`` and every replay of this schedule issue the units as the
    # runtime does, strictly in priority order, each once its gradients are ready; False: the
    # contract's replay, which starts whichever ready unit has the smallest priority (the same
    # on the trace for a schedule numbered in its replay's start order, as ``pace compile``
    # writes). In the file: top-level ``in_order``.
    in_order: bool = False
    meta: Mapping[str, Any] = field(default_factory=dict, compare=False, hash=False)

    def ordered_units(self) -> tuple[Unit, ...]:
        """Units by priority; ties keep file order (a stable sort), as the replay does."""
        return tuple(sorted(self.units, key=lambda u: u.priority))
