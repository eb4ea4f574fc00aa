"""All-reduce cost: measured with real worker processes, or a what-if ring model.

``benchmark_allreduce`` launches ``workers`` real processes (torch.distributed with gloo over TCP
on 127.0.0.1, or Horovod through ``horovodrun --gloo``), all-reduces float32 buffers over a size
sweep, and takes for each size the median over repetitions of the *slowest* rank's time (an
all-reduce is done when every rank has its result). ``fit_comm`` fits
``alpha_us + beta_us_per_byte * bytes`` to the samples and reports the fit quality.
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime as _dt
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from pace.errors import InputError
from pace.ir import CommModel, FrameworkPath, Interference
from pace.options import HOROVOD_RUNTIME_ENV

COMM_FORMAT = "pace.comm"
COMM_VERSION = 1
BACKENDS = ("gloo", "horovod")
# 4 KiB .. 64 MiB by factors of 4: the gradient sizes of the shipped CNNs and transformers.
DEFAULT_SIZES_BYTES: tuple[int, ...] = tuple(4096 * 4**k for k in range(8))
# Per-call latency of a ring all-reduce when nothing was measured (Horovod's negotiation and
# the 2(W-1) ring steps): a what-if default, stated in docs/profiler.md.
DEFAULT_CALL_LATENCY_US = 50.0


@dataclass(frozen=True, kw_only=True, slots=True)
class CommFit:
    """A fitted all-reduce cost model and how well it fits its samples."""

    model: CommModel
    r2: float
    rmse_us: float
    max_rel_error: float
    backend: str = ""
    meta: dict[str, Any] = field(default_factory=dict)


def what_if_comm(*, workers: int, bandwidth_gbps: float) -> CommModel:
    """A ring all-reduce model (``pace.cost``, PACE Eqn. 1) for ``workers`` over a link of
    ``bandwidth_gbps``, plus ``DEFAULT_CALL_LATENCY_US`` per call."""
    from pace.cost import ring_comm_model

    return ring_comm_model(
        workers=workers, bandwidth_gbps=bandwidth_gbps, latency_us=DEFAULT_CALL_LATENCY_US
    )


def fit_comm(samples: Sequence[tuple[int, float]], *, workers: int, backend: str = "") -> CommFit:
    """Fit ``alpha_us + beta_us_per_byte * bytes`` (``pace.cost.fit_linear``) with its quality."""
    from pace.cost import fit_linear

    model, quality = fit_linear([(int(b), float(u)) for b, u in samples], workers=workers)
    y = np.asarray([float(u) for _, u in samples])
    pred = np.asarray([model.cost_us(b) for b, _ in samples])
    return CommFit(
        model=model,
        r2=quality.r2,
        rmse_us=float(np.sqrt(np.mean((y - pred) ** 2))),
        max_rel_error=quality.max_rel_error,
        backend=backend,
    )


def sizes_covering(sizes_bytes: Sequence[int], *, points: int = 8) -> list[int]:
    """A geometric sweep from the smallest to the largest of ``sizes_bytes`` (4-byte aligned)."""
    lo = max(4, min(sizes_bytes))
    hi = max(lo * 4, *sizes_bytes)
    grid = np.geomspace(lo, hi, points)
    return sorted({round(float(v) / 4) * 4 or 4 for v in grid})


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _reps_for(size_bytes: int, reps: int) -> int:
    # Fewer repetitions for big buffers keeps a sweep to seconds on a 2-core machine.
    return max(3, min(reps, int(256 * 2**20 // max(size_bytes, 1))))


def sweep_order(sizes_bytes: Sequence[int], reps: int) -> list[tuple[int, int]]:
    """The timed calls of a sweep as ``(size index, repetition)``, sizes interleaved.

    Round-robin over the sizes, not size after size: a host that slows down during the sweep
    (another tenant, a frequency change) then slows every size alike, which moves ``alpha`` a
    little instead of bending the fit. Measured sequentially on a loaded host, 4 KiB once took
    4.3 ms and 4 MiB 2.4 ms, a negative slope clamped to ``beta = 0``."""
    counts = [_reps_for(s, reps) for s in sizes_bytes]
    return [(i, r) for r in range(max(counts)) for i, n in enumerate(counts) if r < n]


def poor_fit_warning(fit: CommFit) -> str | None:
    """Why a fit should not be trusted, or ``None``: a flat or worse-than-a-constant fit means
    the timings measured the host's noise, not the link."""
    m = fit.model
    if m.beta_us_per_byte > 0 and fit.r2 >= 0.5:
        return None
    return (
        f"the fit is poor (r2={fit.r2:.2f}, beta_us_per_byte={m.beta_us_per_byte:.3e}): the "
        "times did not grow with size, so the host's load, not the link, set them. Measure "
        "again on a quieter host or with more --reps, and cover larger sizes (--sizes)"
    )


@dataclass(frozen=True, kw_only=True, slots=True)
class BatchFit:
    """A least-squares line through the median batch times (``_hvd_bench.batch_times``) over
    the number of tensors issued at once: a lone call (``first_call_us``, the line at one) and
    each further call negotiated in the same cycle (``further_call_us``, the slope)."""

    first_call_us: float
    further_call_us: float
    r2: float
    medians_us: dict[int, float]

    def as_meta(self) -> dict[str, Any]:
        return {
            "first_call_us": round(self.first_call_us, 1),
            "further_call_us": round(self.further_call_us, 1),
            "r2": round(self.r2, 4),
            "medians_us": {str(k): round(v, 1) for k, v in self.medians_us.items()},
        }


def fit_batches(times_us: Mapping[int, Sequence[float]]) -> BatchFit:
    """The line through each count's median batch time (``scipy.stats.linregress``)."""
    from scipy.stats import linregress

    counts = sorted(times_us)
    if len(counts) < 2 or any(not times_us[k] for k in counts):
        raise InputError("need timed batches of at least two counts", field="batches")
    medians = {k: float(np.median(times_us[k])) for k in counts}
    line = linregress(counts, [medians[k] for k in counts])
    slope = float(line.slope)
    return BatchFit(
        first_call_us=float(line.intercept) + slope,
        further_call_us=slope,
        r2=float(line.rvalue) ** 2,
        medians_us=medians,
    )


def read_batches(path: str | Path) -> BatchFit:
    """``fit_batches`` of the batch times ``_hvd_bench.write_batches`` wrote to ``path``."""
    raw = json.loads(Path(path).read_text())
    return fit_batches({int(k): v for k, v in raw.items()})


def with_batches(model: CommModel, fit: BatchFit) -> CommModel:
    """``model`` with the further call's cost (``CommModel.batched_alpha_us``): the share of a
    lone call that ``fit`` measured for a further one (its slope over the line at one), of the
    sweep's lone call (``alpha_us``). A share, not the slope itself: the batches run after the
    sweep, and a host that slows down meanwhile slows both ends of the line alike (in
    bench_netns a lone tiny call once took 12.9 ms in the batches against 1.2-1.5 ms in the
    same launch's sweep, each further one 4.0 ms: the share, 0.32, was within the others',
    0.20-0.59 over nine probes, 0.26-0.32 on loopback). Held within [0, 1]: a line through
    noisy medians can dip below zero or rise above a lone call (the fit, unclipped, is kept in
    the comm file's meta); where the line at one is not above zero, the share is unknown and a
    further call costs a lone one."""
    share = fit.further_call_us / fit.first_call_us if fit.first_call_us > 0 else 1.0
    return dataclasses.replace(model, batched_alpha_us=model.alpha_us * min(max(0.0, share), 1.0))


@dataclass(frozen=True, kw_only=True, slots=True)
class _SweepConfig:
    world: int
    port: int
    sizes: tuple[int, ...]
    reps: int
    warmup: int
    out: str
    interference: bool = False


def _gloo_worker(rank: int, cfg: _SweepConfig) -> None:
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    if cfg.interference:
        from pace.profiler.interference import probe_us

        plain_us = probe_us()  # before the process group (and its threads) start
    dist.init_process_group(
        "gloo",
        init_method=f"tcp://127.0.0.1:{cfg.port}",
        rank=rank,
        world_size=cfg.world,
        timeout=_dt.timedelta(seconds=300),
    )
    try:
        bufs = [torch.ones(max(1, size // 4), dtype=torch.float32) for size in cfg.sizes]
        for buf in bufs:
            for _ in range(cfg.warmup):
                dist.all_reduce(buf)
        times: list[list[float]] = [[] for _ in bufs]
        for i, _rep in sweep_order(cfg.sizes, cfg.reps):
            dist.barrier()
            t0 = time.perf_counter()
            dist.all_reduce(bufs[i])
            elapsed = torch.tensor([time.perf_counter() - t0], dtype=torch.float64)
            dist.all_reduce(elapsed, op=dist.ReduceOp.MAX)
            times[i].append(float(elapsed.item()))
        results = [
            [buf.numel() * 4, float(np.median(t)) * 1e6] for buf, t in zip(bufs, times, strict=True)
        ]
        if rank == 0:
            Path(cfg.out).write_text(json.dumps(results))
        if cfg.interference:
            from pace.profiler.interference import measure_on_rank

            # Every rank holds the same (max-reduced) times, so makes the same calls.
            def allreduce(buf: torch.Tensor) -> None:
                dist.all_reduce(buf)

            measure_on_rank(
                allreduce,
                sizes_bytes=[int(b) for b, _ in results],
                call_us=[us for _, us in results],
                plain_us=plain_us,
                out=f"{cfg.out}.interference",
                rank=rank,
            )
    finally:
        dist.destroy_process_group()


def _run_gloo(
    workers: int, sizes: list[int], reps: int, warmup: int, interference: bool
) -> tuple[list[tuple[int, float]], Interference | None, float]:
    from torch.multiprocessing import spawn  # type: ignore[attr-defined]

    with tempfile.TemporaryDirectory() as tmp:
        out = str(Path(tmp) / "samples.json")
        cfg = _SweepConfig(
            world=workers,
            port=_free_port(),
            sizes=tuple(sizes),
            reps=reps,
            warmup=warmup,
            out=out,
            interference=interference,
        )
        # Real processes (spawned, not forked: no inherited torch thread state).
        spawn(_gloo_worker, args=(cfg,), nprocs=workers, join=True)  # type: ignore[no-untyped-call]
        data = json.loads(Path(out).read_text())
        term, r2 = _interference_of(f"{out}.interference", workers) if interference else (None, 1.0)
    return [(int(b), float(u)) for b, u in data], term, r2


def _interference_of(out: str, workers: int) -> tuple[Interference, float]:
    from pace.profiler.interference import combine_ranks, fit_interference

    plain, idle, samples = combine_ranks(out, workers)
    return fit_interference(plain, idle, samples)


def _run_horovod(
    workers: int,
    sizes: list[int],
    reps: int,
    warmup: int,
    *,
    timeout_s: float,
    interference: bool,
    defaults: bool = False,
) -> tuple[list[tuple[int, float]], Interference | None, float, BatchFit | None]:
    """The sweep under the runtime's Horovod settings (``HOROVOD_RUNTIME_ENV``), or with
    ``defaults`` under Horovod's own (those unset: fusion and the response cache on). Under the
    runtime's settings also the batches of tiny tensors issued at once (``fit_batches``): with
    fusion off, each is its own call, and only the cycle's first pays Horovod's negotiation."""
    try:
        import horovod  # noqa: F401
    except ImportError as exc:
        raise InputError(
            "horovod is not installed (build it with `make horovod`)", field="backend"
        ) from exc
    runner = shutil.which("horovodrun") or str(Path(sys.executable).with_name("horovodrun"))
    if not Path(runner).exists():
        raise InputError("horovodrun was not found next to the Python interpreter", field="backend")
    with tempfile.TemporaryDirectory() as tmp:
        out = str(Path(tmp) / "samples.json")
        cmd = [
            runner,
            "-np",
            str(workers),
            "-H",
            f"localhost:{workers}",
            "--gloo",
            sys.executable,
            "-m",
            "pace.profiler._hvd_bench",
            "--sizes",
            ",".join(map(str, sizes)),
            "--reps",
            str(reps),
            "--warmup",
            str(warmup),
            "--out",
            out,
            *(["--interference"] if interference else []),
            *([] if defaults else ["--batches"]),
        ]
        env = dict(os.environ, OMP_NUM_THREADS="1")
        for key, value in HOROVOD_RUNTIME_ENV.items():
            if defaults:
                env.pop(key, None)
            else:
                env[key] = value
        proc = subprocess.run(
            cmd, capture_output=True, text=True, timeout=timeout_s, env=env, check=False
        )
        if proc.returncode != 0 or not Path(out).exists():
            tail = (proc.stderr or proc.stdout).strip().splitlines()[-5:]
            raise RuntimeError(f"horovodrun failed ({proc.returncode}): " + " | ".join(tail))
        data = json.loads(Path(out).read_text())
        term, r2 = _interference_of(f"{out}.interference", workers) if interference else (None, 1.0)
        batches = None if defaults else read_batches(f"{out}.batches")
    return [(int(b), float(u)) for b, u in data], term, r2, batches


def benchmark_allreduce(
    *,
    backend: str = "gloo",
    workers: int = 2,
    sizes_bytes: Sequence[int] = DEFAULT_SIZES_BYTES,
    reps: int = 10,
    warmup: int = 2,
    timeout_s: float = 600.0,
    interference: bool = False,
    framework: bool = False,
) -> CommFit:
    """Measure all-reduce times with ``workers`` real processes and fit a cost model.

    ``interference``: also measure what computation and communication cost each other on these
    processes (``pace.profiler.interference``, a matrix-product probe) and put the fitted term
    in the model; its fit's R² is ``meta["interference_r2"]``.
    With Horovod the calls run under the runtime's settings (``HOROVOD_RUNTIME_ENV``).
    ``framework`` (Horovod only): sweep again under Horovod's defaults, vanilla Horovod's own
    path, and put its fit (and, with ``interference``, its term) in ``model.framework``, which
    the compiler weighs against its schedule (``pace.compiler.framework_path_us``); its fit's
    R² is ``meta["framework_r2"]``."""
    if backend not in BACKENDS:
        raise InputError(f"must be one of {', '.join(BACKENDS)}, got {backend!r}", field="backend")
    if workers < 2:
        raise InputError(f"must be >= 2 to all-reduce, got {workers}", field="workers")
    sizes = sorted({int(s) for s in sizes_bytes})
    if len(sizes) < 2 or sizes[0] < 4:
        raise InputError("need at least two distinct sizes of >= 4 bytes", field="sizes")
    if reps < 1:
        raise InputError(f"must be >= 1, got {reps}", field="reps")
    if framework and backend != "horovod":
        raise InputError(
            "measures Horovod's own path (its defaults: fusion and response cache on); use "
            "--backend horovod",
            field="framework",
        )
    t0 = time.perf_counter()
    batches = None
    if backend == "gloo":
        samples, term, r2 = _run_gloo(workers, sizes, reps, warmup, interference)
    else:
        samples, term, r2, batches = _run_horovod(
            workers, sizes, reps, warmup, timeout_s=timeout_s, interference=interference
        )
    fit = fit_comm(samples, workers=workers, backend=backend)
    if batches is not None:
        fit = dataclasses.replace(fit, model=with_batches(fit.model, batches))
        fit.meta["batches"] = batches.as_meta()
    if term is not None:
        fit = dataclasses.replace(fit, model=dataclasses.replace(fit.model, interference=term))
        fit.meta["interference_r2"] = round(r2, 4)
    if framework:
        fw_samples, fw_term, fw_r2, _ = _run_horovod(
            workers,
            sizes,
            reps,
            warmup,
            timeout_s=timeout_s,
            interference=interference,
            defaults=True,
        )
        fw_fit = fit_comm(fw_samples, workers=workers, backend=backend)
        path = FrameworkPath(
            backend="horovod",
            alpha_us=fw_fit.model.alpha_us,
            beta_us_per_byte=fw_fit.model.beta_us_per_byte,
            interference=fw_term,
        )
        fit = dataclasses.replace(fit, model=dataclasses.replace(fit.model, framework=path))
        fit.meta["framework_r2"] = round(fw_fit.r2, 4)
        fit.meta["framework_samples"] = [[b, u] for b, u in fw_samples]
        if fw_term is not None:
            fit.meta["framework_interference_r2"] = round(fw_r2, 4)
    fit.meta.update(
        {
            "backend": backend,
            "transport": "tcp 127.0.0.1 (one machine)",
            "reps": reps,
            "warmup": warmup,
            "dtype": "float32",
            "statistic": "median over reps of the slowest rank",
            "seconds": round(time.perf_counter() - t0, 2),
            "date": _dt.datetime.now(_dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
        }
    )
    return fit


def comm_to_dict(fit: CommFit) -> dict[str, Any]:
    """The ``comm.json`` object: the trace's ``comm`` keys plus the fit quality."""
    from pace.io import framework_to_dict, interference_to_dict

    m = fit.model
    return {
        "format": COMM_FORMAT,
        "version": COMM_VERSION,
        "backend": fit.backend,
        "workers": m.workers,
        "algorithm": m.algorithm,
        "alpha_us": m.alpha_us,
        "beta_us_per_byte": m.beta_us_per_byte,
        "samples": [[b, u] for b, u in m.samples],
        **({"interference": interference_to_dict(m.interference)} if m.interference else {}),
        **({"framework": framework_to_dict(m.framework)} if m.framework else {}),
        **({"batched_alpha_us": m.batched_alpha_us} if m.batched_alpha_us is not None else {}),
        "fit": {"r2": fit.r2, "rmse_us": fit.rmse_us, "max_rel_error": fit.max_rel_error},
        "meta": fit.meta,
    }


def save_comm(fit: CommFit, path: str | Path) -> None:
    """Write ``comm.json``, atomically (``pace.io.write_atomic``)."""
    from pace.io import write_atomic

    try:
        text = json.dumps(comm_to_dict(fit), indent=1, allow_nan=False) + "\n"
    except ValueError as exc:
        raise InputError(f"cannot write as JSON: {exc}", where=str(path)) from None
    write_atomic(path, text.encode("utf-8"))


def load_comm(path: str | Path) -> CommModel:
    """A cost model from a ``comm.json`` (``pace profile-comm``) or from a trace's ``comm``.

    Read as strictly as a trace (``pace.io.load_json``: regular files only, strict JSON) and held
    to the same bounds, so the trace it ends up in can be read back.
    """
    from pace.io import (
        MAX_BETA_US_PER_BYTE,
        MAX_DURATION_US,
        MAX_TENSOR_BYTES,
        MAX_WORKERS,
        framework_from_dict,
        interference_from_dict,
        load_json,
    )

    where = str(path)
    obj: Any = load_json(path)
    if obj.get("format") == "pace.trace":
        obj = obj.get("comm")
        if not isinstance(obj, dict):
            raise InputError("missing object", where=where, field="comm")
    elif obj.get("format") != COMM_FORMAT:
        raise InputError(f"expected {COMM_FORMAT!r} or 'pace.trace'", where=where, field="format")
    try:
        workers = obj["workers"]
        alpha = obj["alpha_us"]
        beta = obj["beta_us_per_byte"]
    except KeyError as exc:
        raise InputError("missing key", where=where, field=str(exc.args[0])) from exc
    if not isinstance(workers, int) or isinstance(workers, bool) or not 1 <= workers <= MAX_WORKERS:
        raise InputError(
            f"must be an integer >= 1 and <= {MAX_WORKERS}", where=where, field="workers"
        )
    for key, v, most in (
        ("alpha_us", alpha, MAX_DURATION_US),
        ("beta_us_per_byte", beta, MAX_BETA_US_PER_BYTE),
    ):
        ok = isinstance(v, int | float) and not isinstance(v, bool)
        if not ok or not 0 <= v <= most:
            raise InputError(
                f"must be a finite number >= 0 and <= {most:g}", where=where, field=key
            )
    batched = obj.get("batched_alpha_us")
    if batched is not None and (
        not isinstance(batched, int | float)
        or isinstance(batched, bool)
        or not 0 <= batched <= alpha
    ):
        raise InputError(
            f"must be a finite number >= 0 and <= alpha_us ({alpha:g}): a call negotiated "
            "beside others costs no more than one alone",
            where=where,
            field="batched_alpha_us",
        )
    samples: tuple[tuple[int, float], ...] = ()
    with contextlib.suppress(TypeError, ValueError):
        samples = tuple((int(b), float(u)) for b, u in obj.get("samples", []))
    # Samples are informative only: out-of-range ones are dropped like malformed ones above.
    samples = tuple(
        (b, u) for b, u in samples if 0 <= b <= MAX_TENSOR_BYTES and 0 <= u <= MAX_DURATION_US
    )
    return CommModel(
        workers=workers,
        alpha_us=float(alpha),
        beta_us_per_byte=float(beta),
        algorithm=str(obj.get("algorithm", "ring")),
        samples=samples,
        interference=(
            interference_from_dict(obj["interference"], where=where)
            if "interference" in obj
            else None
        ),
        framework=(
            framework_from_dict(obj["framework"], where=where) if "framework" in obj else None
        ),
        batched_alpha_us=float(batched) if batched is not None else None,
    )
