"""``pace compile``'s default (robust) schedule never replays slower than any baseline.

Exception, by construction of the models: ByteScheduler's credit window lets several units share
the channel at once (processor sharing, ``docs/simulator.md``), which is preemption that pays no
extra per-call latency; a schedule under the contract's one-channel replay cannot do that, so
against the two ByteScheduler policies we assert a 5% band instead (measured worst case on 3000
small random traces: 1.41%, ``benchmarks/bench_shared_channel.py``; docs/scheduling.md, "Limits").
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings

import pace.lp.robust as robust_module
from pace.compiler import compile_trace
from pace.io import load_trace
from pace.ir import CommModel, Op, Tensor, Trace
from tests.strategies import traces

SHARED_CHANNEL = ("bytescheduler", "bytescheduler-tuned")
TRACES = Path(__file__).resolve().parent.parent / "traces"


def _assert_no_baseline_faster(trace: Trace, **what_if: float) -> None:
    res = compile_trace(trace, **what_if)  # type: ignore[arg-type]
    one_channel = {n: us for n, us in res.baselines.items() if n not in SHARED_CHANNEL}
    assert res.predicted_iteration_us <= min(one_channel.values()) * (1 + 1e-9), res.baselines
    shared = min(res.baselines[n] for n in SHARED_CHANNEL)
    assert res.predicted_iteration_us <= shared * 1.05, res.baselines


@settings(max_examples=25)
@given(traces(max_layers=10))
def test_default_compile_is_no_slower_than_any_baseline(trace: Trace) -> None:
    _assert_no_baseline_faster(trace)


def test_urgent_small_gradient_preempts_the_large_one() -> None:
    """The counterexample hypothesis found (seed 37808): the 19 MB gradient is ready 6 us before
    the 2.5 MB one the forward needs first. The schedule must let the small one cut in (a
    1-byte piece holds the channel until it is ready) instead of fusing both or sending the
    large one first; it was 6.7% slower than ByteScheduler before the solver's rounding fix."""
    ops = (
        Op(name="bw.l1", phase="backward", duration_us=600.2426023292769, deps=()),
        Op(name="bw.l0", phase="backward", duration_us=6.2137298106634855, deps=("bw.l1",)),
        Op(name="fw.l0", phase="forward", duration_us=2112.4310446948816, deps=("bw.l0",)),
        Op(name="fw.l1", phase="forward", duration_us=8.081706868667041, deps=("fw.l0",)),
    )
    tensors = (
        Tensor(name="l0.p0", size_bytes=2530916, producer="bw.l0", consumers=("fw.l0",)),
        Tensor(name="l1.p0", size_bytes=19307652, producer="bw.l1", consumers=("fw.l1",)),
    )
    comm = CommModel(workers=8, alpha_us=22.290056949711857, beta_us_per_byte=0.0014)
    trace = Trace(model="synthetic-37808", ops=ops, tensors=tensors, comm=comm)
    _assert_no_baseline_faster(trace)
    res = compile_trace(trace)

    # The small gradient goes before the large one's bulk (the order search may join the
    # 1-byte piece to it: one call fewer).
    def first(tensor: str, *, bulk: bool = False) -> float:
        return min(
            u.priority
            for u in res.schedule.units
            for sl in u.slices
            if sl.tensor == tensor and (sl.size_bytes > 1 or not bulk)
        )

    assert first("l0.p0") < first("l1.p0", bulk=True)
    assert res.predicted_iteration_us <= min(res.baselines[n] for n in SHARED_CHANNEL) * 1.001


def test_robust_choice_falls_back_where_a_baseline_wins_nominally(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The guarantee is the compiler's, whatever the robust selection picks: where its choice
    replays slower than a baseline, the compiler compiles nominally and ships that. Judged in
    the runtime's order, the selection keeps the nominal schedule on every shipped case, so here
    it is made to pick the nominally worst admissible candidate (tolerance 5%): on VGG16 with
    compute 10x faster at 10 Gbps that one loses to a baseline, and the nominal one does not."""

    def worst(nominal: Any, others: Any, limit_us: float) -> tuple[Any, float]:
        pick = max(
            [nominal, *(o for o in others if o.nominal_us <= limit_us)], key=lambda o: o.nominal_us
        )
        return pick, pick.mean_us()

    trace = load_trace(TRACES / "vgg16.json.gz")
    plain = compile_trace(trace, compute_speedup=10.0, bandwidth_gbps=10.0, robust_tolerance=0.05)
    assert "robust_dropped" not in plain.schedule.meta
    monkeypatch.setattr(robust_module, "select_robust", worst)
    res = compile_trace(trace, compute_speedup=10.0, bandwidth_gbps=10.0, robust_tolerance=0.05)
    assert res.predicted_iteration_us <= min(res.baselines.values())
    assert "robust_dropped" in res.schedule.meta
    assert res.predicted_iteration_us == plain.predicted_iteration_us
    assert not [w for w in res.warnings if w.startswith("baseline")]
