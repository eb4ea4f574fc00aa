"""Background recompile, rank 0's controller, and the switch protocol on thread-simulated ranks."""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Callable

import pytest

from pace.drift.estimate import IterationStats, ObservedStats
from pace.drift.replan import (
    DriftController,
    ReplanError,
    Replanner,
    SwitchProtocol,
    decode_switch,
    encode_switch,
)
from pace.drift.trigger import TriggerOptions
from pace.errors import InputError
from pace.io import trace_digest
from pace.ir import Schedule, Slice, Trace, Unit
from pace.synth import random_trace


def _schedule(trace: Trace, order: list[str], tag: str) -> Schedule:
    sizes = {t.name: t.size_bytes for t in trace.tensors}
    units = tuple(
        Unit(priority=float(i), slices=(Slice(tensor=n, offset_bytes=0, size_bytes=sizes[n]),))
        for i, n in enumerate(order)
    )
    return Schedule(
        trace_digest=trace_digest(trace),
        cost_model=trace.comm,
        units=units,
        predicted_iteration_us=1000.0,
        meta={"tag": tag},
    )


def _issue_order(schedule: Schedule) -> tuple[str, ...]:
    """What a rank's dispatcher would issue, in order: one key per unit."""
    return tuple(
        "+".join(f"{s.tensor}@{s.offset_bytes}" for s in u.slices) for u in schedule.ordered_units()
    )


class ThreadBroadcast:
    """broadcast_bytes over threads: rank 0 writes, a barrier, everyone reads, a barrier."""

    def __init__(self, ranks: int) -> None:
        self._barrier = threading.Barrier(ranks, timeout=30)
        self._slot = b""
        self.calls = 0

    def for_rank(self, rank: int) -> Callable[[bytes | None], bytes]:
        def bcast(payload: bytes | None) -> bytes:
            if rank == 0:
                assert payload is not None
                self._slot = payload
                self.calls += 1
            else:
                assert payload is None
            self._barrier.wait()
            out = self._slot
            self._barrier.wait()  # nobody overwrites the slot before everyone read it
            return out

        return bcast


def _stats_with_beta(beta: float, n: int, times: list[float] | None = None) -> ObservedStats:
    recent = times[-n:] if times else [1000.0] * n
    return ObservedStats(
        iterations=tuple(
            IterationStats(
                iteration=i,
                iteration_us=t,
                unit_samples=((1000, 10.0 + beta * 1000), (100_000, 10.0 + beta * 100_000)),
            )
            for i, t in enumerate(recent)
        )
    )


# ---------------------------------------------------------------------------------------------


def test_replanner_one_at_a_time_and_failure() -> None:
    gate = threading.Event()

    def slow_compile(trace: Trace) -> str:
        gate.wait(10)
        return "new"

    with Replanner(
        compile_fn=slow_compile, predict_fn=lambda t, p: 1.0 if p == "new" else 2.0
    ) as rp:
        trace = random_trace(seed=1, n_layers=3)
        assert rp.submit(trace, "old")
        assert rp.busy
        assert not rp.submit(trace, "old")  # one at a time
        assert rp.poll() is None
        gate.set()
        cand = rp.wait(10)
        assert cand is not None
        assert (cand.plan, cand.current_us, cand.candidate_us) == ("new", 2.0, 1.0)
        assert not rp.busy

    def bad_compile(trace: Trace) -> str:
        raise RuntimeError("solver exploded")

    with Replanner(compile_fn=bad_compile, predict_fn=lambda t, p: 1.0) as rp:
        assert rp.submit(random_trace(seed=2, n_layers=2), "old")
        with pytest.raises(ReplanError, match="solver exploded"):
            rp.wait(10)
        assert rp.failures == 1
        assert not rp.busy


def _controller(
    compile_fn: Callable[[Trace], str],
    predict_fn: Callable[[Trace, str], float],
    stats: Callable[[int], ObservedStats],
) -> DriftController[str]:
    trace = random_trace(seed=3, n_layers=4)
    return DriftController(
        trace=trace,
        plan="old",
        predicted_iteration_us=1000.0,
        replanner=Replanner(compile_fn=compile_fn, predict_fn=predict_fn),
        observed=stats,
        trigger_options=TriggerOptions(consecutive=3, cooldown_iterations=5),
        synchronous=True,
    )


def test_controller_switches_on_gain_and_reestimates_comm() -> None:
    seen: list[float] = []

    def compile_fn(trace: Trace) -> str:
        seen.append(trace.comm.beta_us_per_byte)
        return "new"

    ctl = _controller(
        compile_fn,
        lambda t, p: 900.0 if p == "new" else 1000.0,
        lambda n: _stats_with_beta(0.002, n),
    )
    out = [ctl.step(t) for t in [1000.0] * 5 + [1500.0] * 3]
    assert out[:-1] == [None] * 7
    assert out[-1] == "new"
    assert ctl.plan == "new"
    assert seen == [pytest.approx(0.002)]
    assert ctl.estimated_trace.comm.alpha_us == pytest.approx(10.0)
    assert [e.kind for e in ctl.events] == ["fired", "switched"]
    # The reference moved to the candidate's prediction: 900 +- 10% is now the band.
    assert ctl.trigger.reference_us == 900.0
    ctl.replanner.close()


def test_controller_keeps_plan_when_gain_small_or_compile_fails() -> None:
    ctl = _controller(
        lambda t: "new",
        lambda t, p: 980.0 if p == "new" else 1000.0,
        lambda n: _stats_with_beta(0.001, n),
    )
    assert all(ctl.step(1500.0) is None for _ in range(3))
    assert ctl.plan == "old"
    assert [e.kind for e in ctl.events] == ["fired", "kept"]
    assert ctl.trigger.reference_us == 1000.0  # old plan's prediction under the new estimate
    ctl.replanner.close()

    def boom(trace: Trace) -> str:
        raise ValueError("no")

    ctl = _controller(boom, lambda t, p: 1.0, lambda n: _stats_with_beta(0.001, n))
    assert all(ctl.step(1500.0) is None for _ in range(3))
    assert ctl.plan == "old"
    assert [e.kind for e in ctl.events] == ["fired", "failed"]
    ctl.replanner.close()


@pytest.mark.parametrize("calibrate", [True, False])
def test_biased_model_fires_once_when_calibrated(calibrate: bool) -> None:
    # The model predicts 1000 us, reality is a steady 1150 us (a biased model, no drift).
    times: list[float] = []
    trace = random_trace(seed=8, n_layers=3)
    ctl: DriftController[str] = DriftController(
        trace=trace,
        plan="only",
        predicted_iteration_us=1000.0,
        replanner=Replanner(compile_fn=lambda t: "only", predict_fn=lambda t, p: 1000.0),
        observed=lambda n: _stats_with_beta(0.001, n, times),
        trigger_options=TriggerOptions(consecutive=3, cooldown_iterations=5),
        synchronous=True,
        calibrate=calibrate,
    )
    for _ in range(200):
        times.append(1150.0)
        ctl.step(1150.0)
    fired = [e for e in ctl.events if e.kind == "fired"]
    if calibrate:
        assert len(fired) == 1
        assert ctl.trigger.reference_us == pytest.approx(1150.0)
    else:
        assert len(fired) > 10  # fires every cool-down: the failure calibration prevents
    ctl.replanner.close()


def test_switch_message_round_trip_and_garbage() -> None:
    trace = random_trace(seed=4, n_layers=3)
    sched = _schedule(trace, [t.name for t in trace.tensors], "a")
    at, back = decode_switch(encode_switch(sched, 42))
    assert at == 42
    assert back == sched
    for bad in (b"\xff", b"[]", b'{"format": "pace.switch", "version": 1, "switch_at": "x"}'):
        with pytest.raises(InputError):
            decode_switch(bad)


def _predict(trace: Trace, schedule: Schedule) -> float:
    """Fake replay after the drift: the initial order takes 1400 us, a replanned one its tag."""
    return float(schedule.meta.get("us", 1400.0))


def _run_ranks(
    *,
    ranks: int,
    iterations: int,
    compile_fn: Callable[[Trace], Schedule],
    sync_every: int,
    lag: int,
    seed: int,
) -> tuple[list[list[tuple[str, ...]]], list[list[int]], DriftController[Schedule]]:
    """Each rank 'issues' its schedule's units every iteration; rank 0 runs the controller."""
    trace = random_trace(seed=seed, n_layers=6)
    names = [t.name for t in trace.tensors]
    initial = _schedule(trace, names, "initial")
    bcast = ThreadBroadcast(ranks)
    rank0_times: list[float] = []
    logs: list[list[tuple[str, ...]]] = [[] for _ in range(ranks)]
    protos = [
        SwitchProtocol(rank=r, broadcast_bytes=bcast.for_rank(r), sync_every=sync_every, lag=lag)
        for r in range(ranks)
    ]
    ctl = DriftController(
        trace=trace,
        plan=initial,
        predicted_iteration_us=1000.0,
        replanner=Replanner(compile_fn=compile_fn, predict_fn=_predict),
        observed=lambda n: _stats_with_beta(0.003, n, rank0_times),
        trigger_options=TriggerOptions(consecutive=5, cooldown_iterations=10),
    )
    errors: list[BaseException] = []

    def rank_main(r: int) -> None:
        rng = random.Random(seed * 100 + r)
        sched = initial
        try:
            for it in range(iterations):
                logs[r].append(_issue_order(sched))
                if rng.random() < 0.05:
                    time.sleep(rng.random() * 0.002)  # jitter: ranks drift apart in time
                if r == 0:
                    # Bandwidth halves at iteration 100: the initial schedule slows down by 40%.
                    observed_us = 1000.0 if it < 100 else _predict(trace, sched)
                    observed_us *= 1 + rng.uniform(-0.02, 0.02)
                    rank0_times.append(observed_us)
                    accepted = ctl.step(observed_us)
                    if accepted is not None:
                        protos[0].propose(accepted)
                new = protos[r].boundary(it)
                if new is not None:
                    sched = new
        except BaseException as exc:
            errors.append(exc)
            raise

    threads = [threading.Thread(target=rank_main, args=(r,), daemon=True) for r in range(ranks)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not any(t.is_alive() for t in threads), "deadlock"
    assert not errors, errors
    ctl.replanner.close()
    return logs, [p.switches for p in protos], ctl


@pytest.mark.parametrize(("sync_every", "lag"), [(1, 1), (7, 3)])
def test_all_ranks_switch_at_the_same_iteration(sync_every: int, lag: int) -> None:
    def compile_fn(trace: Trace) -> Schedule:
        time.sleep(0.01)  # the compile takes a few iterations of wall time
        names = [t.name for t in reversed(trace.tensors)]
        s = _schedule(trace, names, "replanned")
        return Schedule(
            trace_digest=s.trace_digest,
            cost_model=trace.comm,
            units=s.units,
            predicted_iteration_us=1200.0,
            meta={"tag": "replanned", "us": 1200.0},
        )

    logs, switches, ctl = _run_ranks(
        ranks=3, iterations=300, compile_fn=compile_fn, sync_every=sync_every, lag=lag, seed=5
    )
    assert logs[0] == logs[1] == logs[2]
    assert switches[0] == switches[1] == switches[2]
    assert len(switches[0]) == 1
    at = switches[0][0]
    assert at > 100
    assert at % sync_every == lag % sync_every or sync_every == 1
    # Before the switch every rank issued the initial order, after it the replanned one.
    assert logs[0][at - 1] != logs[0][at]
    assert logs[0][at] == tuple(reversed(logs[0][0]))
    assert [e.kind for e in ctl.events] == ["fired", "switched"]


def test_failed_compile_keeps_old_schedule_on_all_ranks() -> None:
    def compile_fn(trace: Trace) -> Schedule:
        raise RuntimeError("compile failed")

    logs, switches, ctl = _run_ranks(
        ranks=2, iterations=200, compile_fn=compile_fn, sync_every=5, lag=2, seed=6
    )
    assert logs[0] == logs[1]
    assert switches == [[], []]
    assert len(set(logs[0])) == 1
    assert "failed" in [e.kind for e in ctl.events]


def test_only_root_proposes() -> None:
    proto = SwitchProtocol(rank=1, broadcast_bytes=lambda b: b"")
    trace = random_trace(seed=7, n_layers=2)
    with pytest.raises(ValueError, match="only rank 0"):
        proto.propose(_schedule(trace, [t.name for t in trace.tensors], "x"))


def test_jitter_predictor_averages_over_deterministic_worlds() -> None:
    from pace.drift.replan import JitterPredictor

    trace = random_trace(seed=9, n_layers=4)
    seen: list[float] = []

    def predict(t: Trace, plan: str) -> float:
        seen.append(t.comm.beta_us_per_byte)
        return t.comm.beta_us_per_byte / trace.comm.beta_us_per_byte

    assert JitterPredictor(predict, compute_sd=0.0, comm_sd=0.0, samples=1)(trace, "p") == 1.0
    jp = JitterPredictor(predict, compute_sd=0.02, comm_sd=0.05, samples=8, seed=4)
    seen.clear()
    a = jp(trace, "p")
    first = list(seen)
    assert len(first) == 8
    assert first[0] == trace.comm.beta_us_per_byte  # the noise-free world is one of them
    assert len(set(first)) == 8
    assert jp(trace, "p") == a  # same seed, same worlds
    assert a == pytest.approx(1.0, abs=0.1)
    with pytest.raises(ValueError, match="samples"):
        JitterPredictor(predict, compute_sd=0.0, comm_sd=0.0, samples=0)
