"""The simulator's modes for how the runtime drives the link (docs/simulator.md, "Modes"):

* ``queued``: units in flight cross one at a time in issue order (an in-order backend), so the
  credit bounds how far ahead they are committed;
* ``agreed_readiness``: a unit goes only once every rank knows its gradients are ready, learnt
  from completed calls or a probe round (the runtime's online mode, docs/runtime.md).
"""

from __future__ import annotations

import dataclasses
import itertools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pace.analysis import analyze
from pace.errors import InputError
from pace.ir import CommModel, Interference, Op, Tensor, Trace
from pace.sim import SimOptions, simulate
from pace.sim.policies import bytescheduler
from tests.strategies import traces

EPS = 1e-6
AGREED = SimOptions(agreed_readiness=True)


def two_gradients(alpha_us: float) -> Trace:
    """b2 produces w2 at 10 us, b1 produces w1 at 20 us; w2 takes alpha + 100 us on the wire."""
    return Trace(
        model="two",
        ops=(
            Op(name="b2", phase="backward", duration_us=10),
            Op(name="b1", phase="backward", duration_us=10, deps=("b2",)),
            Op(name="f1", phase="forward", duration_us=5, deps=("b1",)),
            Op(name="f2", phase="forward", duration_us=5, deps=("f1",)),
        ),
        tensors=(
            Tensor(name="w1", size_bytes=1, producer="b1", consumers=("f1",)),
            Tensor(name="w2", size_bytes=100, producer="b2", consumers=("f2",)),
        ),
        comm=CommModel(workers=2, alpha_us=alpha_us, beta_us_per_byte=1.0),
    )


def starts(trace: Trace, options: SimOptions) -> dict[str, float]:
    res = simulate(trace, "fifo", options=options)
    return {u.slices[0].tensor: s for u, s in zip(res.units, res.unit_start_us, strict=True)}


def test_without_agreement_a_gradient_goes_when_produced() -> None:
    got = starts(two_gradients(0.0), SimOptions())
    assert got == {"w2": pytest.approx(10.0), "w1": pytest.approx(110.0)}


@pytest.mark.parametrize(
    ("alpha_us", "w1_start"),
    [
        # The probe (alpha + 8 flag bytes) ends at 10 + 9 = 19 < 20: w2 goes then without w1's
        # flag, so w1 needs a second probe after w2's call: 19 + 101 + 9.
        (1.0, 19.0 + 101.0 + 9.0),
        # The probe ends at 10 + 18 = 28 > 20: w1 was produced when w2's call was issued, so
        # w2's completion makes it known and w1 goes at once.
        (10.0, 28.0 + 110.0),
    ],
)
def test_a_gradient_is_known_from_a_later_call_or_a_probe(alpha_us: float, w1_start: float) -> None:
    probe_us = alpha_us + 8.0  # one 4-byte flag per gradient
    got = starts(two_gradients(alpha_us), AGREED)
    assert got["w2"] == pytest.approx(10.0 + probe_us)
    assert got["w1"] == pytest.approx(w1_start)


@pytest.mark.parametrize("field", ["agreed_readiness", "queued"])
def test_cycle_fusion_negotiates_and_runs_its_units_by_itself(field: str) -> None:
    with pytest.raises(InputError, match=field):
        simulate(two_gradients(1.0), "horovod", options=SimOptions(**{field: True}))


@settings(max_examples=60, deadline=None)
@given(
    trace=traces(max_layers=8),
    credit=st.sampled_from([1, 2, 4]),
    policy=st.sampled_from(["fifo", "bytescheduler"]),
)
def test_every_unit_waits_for_its_readiness_to_be_agreed(
    trace: Trace, credit: int, policy: str
) -> None:
    """Each unit starts after a witness that its gradients are known everywhere: a call issued
    after they were all produced has completed, or a probe fitted in between. And it is never
    sooner than with readiness known at once (one unit in flight)."""
    prep = analyze(trace)
    probe_us = trace.comm.cost_us(4 * len(prep.tensor_names))
    pol = (
        bytescheduler(partition_bytes=max(1, max(prep.size_bytes) // 3))
        if policy != "fifo"
        else policy
    )
    res = simulate(trace, pol, options=SimOptions(credit=credit, agreed_readiness=True))
    spans = list(zip(res.unit_start_us, res.unit_finish_us, strict=True))
    for u, unit in enumerate(res.units):
        ready = max(prep.release_us[prep.tensor_index[s.tensor]] for s in unit.slices)
        start = spans[u][0]
        by_call = any(
            s >= ready - EPS and f <= start + EPS for v, (s, f) in enumerate(spans) if v != u
        )
        assert by_call or start >= ready + probe_us - EPS, (u, ready, start)
    # Every tensor is still reduced, and the iteration ends after its last call.
    assert all(t < float("inf") for t in res.tensor_done_us)
    assert res.iteration_us >= res.comm_end_us - EPS
    if credit == 1:
        # One work-conserving server: its busy periods depend only on when work arrives, and
        # agreement only makes it arrive later.
        plain = simulate(trace, pol, options=SimOptions(credit=1))
        assert res.comm_end_us >= plain.comm_end_us - EPS


def test_interference_and_agreement_together() -> None:
    """The joint event loop (the interference term) drives the same channel."""
    trace = two_gradients(1.0)
    term = Interference(comm_us_per_call=1e-9)  # active, and too small to move anything
    joint = dataclasses.replace(trace, comm=dataclasses.replace(trace.comm, interference=term))
    assert starts(joint, AGREED) == pytest.approx(starts(trace, AGREED), abs=1e-3)


def three_units() -> Trace:
    """b3 produces w3 and w2 at 10 us (2 x 100 us on the wire); b1 produces w1 (10 us on the
    wire) at 20 us. Layer priority (forward order): w1, w2, w3."""
    return Trace(
        model="three",
        ops=(
            Op(name="b3", phase="backward", duration_us=10),
            Op(name="b1", phase="backward", duration_us=10, deps=("b3",)),
            Op(name="f1", phase="forward", duration_us=5, deps=("b1",)),
            Op(name="f2", phase="forward", duration_us=5, deps=("f1",)),
            Op(name="f3", phase="forward", duration_us=5, deps=("f2",)),
        ),
        tensors=(
            Tensor(name="w1", size_bytes=10, producer="b1", consumers=("f1",)),
            Tensor(name="w2", size_bytes=100, producer="b3", consumers=("f2",)),
            Tensor(name="w3", size_bytes=100, producer="b3", consumers=("f3",)),
        ),
        comm=CommModel(workers=2, alpha_us=0.0, beta_us_per_byte=1.0),
    )


def layer_starts(options: SimOptions) -> dict[str, float]:
    res = simulate(three_units(), bytescheduler(partition_bytes=1000), options=options)
    return {u.slices[0].tensor: s for u, s in zip(res.units, res.unit_start_us, strict=True)}


def test_a_queue_commits_ahead_and_a_late_urgent_unit_waits_behind() -> None:
    # One in flight: w1 (ready at 20, first priority) overtakes w3 when w2 finishes at 110.
    assert layer_starts(SimOptions(credit=1)) == pytest.approx(
        {"w2": 10.0, "w1": 110.0, "w3": 120.0}
    )
    # Two queued: w3 was committed at 10 behind w2, so w1 goes only after both.
    assert layer_starts(SimOptions(credit=2, queued=True)) == pytest.approx(
        {"w2": 10.0, "w3": 110.0, "w1": 210.0}
    )
    # Two sharing (the default meaning of a credit): w3 and w2 share the link from 10.
    shared = layer_starts(SimOptions(credit=2))
    assert shared["w3"] == shared["w2"] == pytest.approx(10.0)


@settings(max_examples=60, deadline=None)
@given(trace=traces(max_layers=8), credit=st.sampled_from([1, 2, 3, 8]))
def test_a_queue_runs_one_unit_at_a_time_without_idling(trace: Trace, credit: int) -> None:
    """Queued units never overlap on the link, none starts before its gradients exist, the link
    idles only when nothing is queued, and a queue of one is the contract's replay."""
    prep = analyze(trace)
    pol = bytescheduler(partition_bytes=max(1, max(prep.size_bytes) // 2))
    res = simulate(trace, pol, options=SimOptions(credit=credit, queued=True))
    spans = sorted(zip(res.unit_start_us, res.unit_finish_us, range(len(res.units)), strict=True))
    for (_, f0, _), (s1, _, _) in itertools.pairwise(spans):
        assert s1 >= f0 - EPS
    for s, f, u in spans:
        ready = max(prep.release_us[prep.tensor_index[x.tensor]] for x in res.units[u].slices)
        assert s >= ready - EPS
        assert f - s == pytest.approx(trace.comm.cost_us(res.units[u].size_bytes), rel=1e-9)
    for (_, f0, _), (s1, _, u1) in itertools.pairwise(spans):
        if s1 > f0 + EPS:  # an idle gap: the next unit was not ready before it ended
            ready = max(prep.release_us[prep.tensor_index[x.tensor]] for x in res.units[u1].slices)
            assert ready >= s1 - EPS
    one = simulate(trace, pol, options=SimOptions(credit=1))
    if credit == 1:
        assert res.unit_start_us == pytest.approx(one.unit_start_us)
    # Committing ahead never moves the link's last byte earlier (one work-conserving server).
    assert res.comm_end_us == pytest.approx(one.comm_end_us, rel=1e-9, abs=EPS)
