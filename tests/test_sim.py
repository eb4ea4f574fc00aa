"""Simulator and baselines on hand-built traces; every expected time is worked out by hand."""

from __future__ import annotations

import dataclasses

import pytest

from pace.analysis import analyze
from pace.errors import InputError
from pace.ir import CommModel, Op, Schedule, Slice, Tensor, Trace, Unit
from pace.sim import (
    POLICIES,
    SimOptions,
    compare,
    schedule_policy,
    simulate,
    units_policy,
)
from pace.sim.policies import bytescheduler, ddp, horovod, p3, partition_units


def chain_trace(
    ops: list[tuple[str, str, float]],
    tensors: list[tuple[str, int, str, tuple[str, ...]]],
    *,
    alpha: float = 0.0,
    beta: float = 1.0,
    deps: dict[str, tuple[str, ...]] | None = None,
) -> Trace:
    """Ops chained in list order unless ``deps`` names an op's deps explicitly."""
    built: list[Op] = []
    prev: str | None = None
    for name, phase, dur in ops:
        d = deps[name] if deps is not None and name in deps else ((prev,) if prev else ())
        built.append(Op(name=name, phase=phase, duration_us=dur, deps=d))  # type: ignore[arg-type]
        prev = name
    return Trace(
        model="hand",
        ops=tuple(built),
        tensors=tuple(
            Tensor(name=n, size_bytes=b, producer=p, consumers=c) for n, b, p, c in tensors
        ),
        comm=CommModel(workers=2, alpha_us=alpha, beta_us_per_byte=beta),
    )


def tiny() -> Trace:
    """tests/data/tiny.trace.json (the worked example of docs/design.md)."""
    return chain_trace(
        [
            ("bw.layer2", "backward", 10),
            ("bw.layer1", "backward", 10),
            ("fw.layer1", "forward", 5),
            ("fw.layer2", "forward", 5),
        ],
        [
            ("layer2.weight", 20, "bw.layer2", ("fw.layer2",)),
            ("layer1.weight", 4, "bw.layer1", ("fw.layer1",)),
        ],
    )


def sl(tensor: str, offset: int, size: int) -> Slice:
    return Slice(tensor=tensor, offset_bytes=offset, size_bytes=size)


# The units of tests/data/tiny.schedule.json (the optimal preemptive schedule).
TINY_OPTIMAL_UNITS = (
    Unit(priority=10, slices=(sl("layer2.weight", 0, 10),)),
    Unit(priority=20, slices=(sl("layer1.weight", 0, 4),)),
    Unit(priority=24, slices=(sl("layer2.weight", 10, 10),)),
)


# --- the worked example -------------------------------------------------------------------


def test_tiny_fifo_is_44() -> None:
    # layer2 10-30, layer1 30-34; fw.layer1 34-39; fw.layer2 39-44.
    res = simulate(tiny(), "fifo")
    assert res.iteration_us == 44
    assert res.options.barrier is True
    assert res.unit_start_us == (10, 30)
    assert res.unit_finish_us == (30, 34)
    assert res.op_start_us == (0, 10, 34, 39)
    assert simulate(tiny(), "fifo", options=SimOptions(barrier=False)).iteration_us == 44


def test_tiny_optimal_schedule_replays_to_39() -> None:
    # layer2[0:10] 10-20; layer1 20-24; fw.layer1 24-29; layer2[10:20] 24-34; fw.layer2 34-39.
    res = simulate(tiny(), units_policy(TINY_OPTIMAL_UNITS))
    assert res.iteration_us == 39
    assert res.unit_start_us == (10, 20, 24)
    assert res.unit_finish_us == (20, 24, 34)
    assert res.tensor_done_us == (34, 24)
    assert res.op_start_us == (0, 10, 24, 34)
    assert res.comm_busy_us == 24
    # Comm 10-34 overlaps compute 0-20, 24-29 and 34-39: 10 + 5.
    assert res.overlap_us == 15


def test_schedule_policy_replays_the_units_of_a_schedule() -> None:
    sched = Schedule(
        trace_digest="x",
        cost_model=CommModel(workers=2, alpha_us=0, beta_us_per_byte=1),
        units=TINY_OPTIMAL_UNITS,
        predicted_iteration_us=39,
    )
    assert simulate(tiny(), schedule_policy(sched)).iteration_us == 39
    assert simulate(tiny(), sched).iteration_us == 39


def test_barrier_holds_the_forward_pass_until_all_communication_ends() -> None:
    # Comm ends at 34: fw.layer1 34-39, fw.layer2 39-44.
    res = simulate(tiny(), units_policy(TINY_OPTIMAL_UNITS), options=SimOptions(barrier=True))
    assert res.iteration_us == 44
    assert res.op_start_us == (0, 10, 34, 39)


def test_critical_path_of_tiny_is_30() -> None:
    assert analyze(tiny()).critical_path_us == 30


def test_credit_two_shares_the_bandwidth() -> None:
    # layer2 alone 10-20 (10 bytes left); from 20 both at half rate: layer1's 4 bytes take 8 us
    # (done 28), layer2 has 6 left, alone again: done 34. fw.layer1 28-33, fw.layer2 34-39.
    fifo_units = (
        Unit(priority=0, slices=(sl("layer2.weight", 0, 20),)),
        Unit(priority=1, slices=(sl("layer1.weight", 0, 4),)),
    )
    res = simulate(tiny(), units_policy(fifo_units), options=SimOptions(credit=2))
    assert res.unit_start_us == (10, 20)
    assert res.unit_finish_us == pytest.approx((34, 28))
    assert res.iteration_us == pytest.approx(39)
    assert res.comm_busy_us == pytest.approx(24)


def test_bytescheduler_defaults_on_tiny() -> None:
    # Partition 32 MB (whole tensors), credit 64 MB / 32 MB = 2 units: the credit-2 sharing of
    # the test above, 39. The byte-window model admits both too: same.
    res = simulate(tiny(), "bytescheduler")
    assert res.options.credit == 2
    assert res.options.credit_bytes is None
    assert res.iteration_us == pytest.approx(39)
    res = simulate(tiny(), bytescheduler(window="bytes"))
    assert res.options.credit is None
    assert res.options.credit_bytes == 64_000_000
    assert res.options.barrier is False
    assert res.iteration_us == pytest.approx(39)


TINY_FIFO_UNITS = (
    Unit(priority=0, slices=(sl("layer2.weight", 0, 20),)),
    Unit(priority=1, slices=(sl("layer1.weight", 0, 4),)),
)


def test_byte_window_holds_back_a_unit_while_the_bytes_in_flight_reach_it() -> None:
    # Window 10 bytes: layer2 (20 bytes) starts at 10 (nothing in flight) and fills it; layer1
    # (ready 20) waits for it: 30-34; fw.layer1 34-39, fw.layer2 39-44.
    res = simulate(tiny(), units_policy(TINY_FIFO_UNITS), options=SimOptions(credit_bytes=10))
    assert res.unit_start_us == (10, 30)
    assert res.iteration_us == 44
    # Window 21 bytes: 20 in flight < 21, so layer1 joins at 20 and they share: 39.
    res = simulate(tiny(), units_policy(TINY_FIFO_UNITS), options=SimOptions(credit_bytes=21))
    assert res.unit_start_us == (10, 20)
    assert res.iteration_us == pytest.approx(39)
    # A unit cap on top of the window: credit 1 wins.
    res = simulate(
        tiny(), units_policy(TINY_FIFO_UNITS), options=SimOptions(credit_bytes=21, credit=1)
    )
    assert res.iteration_us == 44


def test_bytescheduler_small_window_on_tiny() -> None:
    # 4-byte pieces, 8-byte window. layer order: layer1 first. At 10 layer2's five pieces are
    # ready: two start (8 bytes in flight), sharing: both done at 18; two more 18-26; at 20 layer1
    # is ready but the window is full until 26: then layer1 and layer2's last piece share,
    # both done at 34. fw.layer1 34-39, fw.layer2 39-44.
    res = simulate(tiny(), bytescheduler(partition_bytes=4, credit_bytes=8, window="bytes"))
    assert res.tensor_done_us == pytest.approx((34, 34))
    assert res.iteration_us == pytest.approx(44)


def test_p3_slices_let_the_first_layer_jump_ahead() -> None:
    # 4-byte slices, layer order: layer1 first. layer2's slices 10-14, 14-18, 18-22; layer1
    # (ready 20) goes next 22-26; layer2 26-30, 30-34. fw.layer1 26-31, fw.layer2 34-39.
    res = simulate(tiny(), p3(slice_bytes=4))
    assert len(res.units) == 6
    assert res.iteration_us == 39
    assert res.tensor_done_us == (34, 26)


def test_p3_default_slice_is_160_kib() -> None:
    trace = chain_trace(
        [("bw", "backward", 1), ("fw", "forward", 1)],
        [("w", 400 * 1024, "bw", ("fw",))],
    )
    units = partition_units(analyze(trace), (0,), 160 * 1024)
    assert [u.size_bytes for u in units] == [160 * 1024, 160 * 1024, 80 * 1024]
    assert [u.slices[0].offset_bytes for u in units] == [0, 160 * 1024, 320 * 1024]
    assert len(simulate(trace, "p3").units) == 3


def three_tensor_trace() -> Trace:
    """Ready at 10, 10 and 11; `small` is needed first (by fw1)."""
    return chain_trace(
        [
            ("bwA", "backward", 10),
            ("bwB", "backward", 1),
            ("fw1", "forward", 5),
            ("fw2", "forward", 5),
        ],
        [
            ("big", 20, "bwA", ("fw2",)),
            ("mid", 5, "bwA", ("fw2",)),
            ("small", 4, "bwB", ("fw1",)),
        ],
    )


def test_fifo_vs_tictac_order() -> None:
    trace = three_tensor_trace()
    # FIFO: big 10-30, mid 30-35, small 35-39; fw1 39-44, fw2 44-49.
    assert simulate(trace, "fifo").iteration_us == 49
    # TicTac: at 10 only big and mid are ready: big 10-30; at 30 small (needed at 11) beats
    # mid: small 30-34, mid 34-39; fw1 34-39, fw2 39-44.
    res = simulate(trace, "tictac")
    assert res.iteration_us == 44
    assert res.options.barrier is False
    assert res.tensor_done_us == (30, 39, 34)


def cycle_trace(bw1_us: float) -> Trace:
    """w3 ready at 5, w2 at 10, w1 at 10 + bw1_us; alpha 1, beta 1."""
    return chain_trace(
        [
            ("bw3", "backward", 5),
            ("bw2", "backward", 5),
            ("bw1", "backward", bw1_us),
            ("fw1", "forward", 1),
            ("fw2", "forward", 1),
            ("fw3", "forward", 1),
        ],
        [
            ("w3", 10, "bw3", ("fw3",)),
            ("w2", 10, "bw2", ("fw2",)),
            ("w1", 10, "bw1", ("fw1",)),
        ],
        alpha=1.0,
    )


def test_horovod_cycle_fusion_fuses_what_is_ready_at_each_tick() -> None:
    trace = cycle_trace(5)
    # Tick at 5 (first production): [w3] 5-16. Next tick max(5+10, 16) = 16: w2 and w1 (20
    # bytes <= 25) fused, 16-37. Barrier: fw1 37-38, fw2 38-39, fw3 39-40.
    res = simulate(trace, horovod(threshold_bytes=25, cycle_us=10))
    assert [u.tensors for u in res.units] == [("w3",), ("w2", "w1")]
    assert res.unit_start_us == (5, 16)
    assert res.unit_finish_us == (16, 37)
    assert res.iteration_us == 40
    # Threshold 15: w2 and w1 go separately, 16-27 and 27-38; fw1 38 .. fw3 ends 41.
    res = simulate(trace, horovod(threshold_bytes=15, cycle_us=10))
    assert [u.tensors for u in res.units] == [("w3",), ("w2",), ("w1",)]
    assert res.iteration_us == 41


def test_horovod_idle_thread_wakes_on_its_cycle_grid() -> None:
    trace = cycle_trace(20)
    # [w3] 5-16; tick 16: [w2] 16-27; next earliest tick max(26, 27) = 27, idle. w1 is produced
    # at 30: the thread next wakes at 27 + 10 = 37: [w1] 37-48. fw1 48 .. fw3 ends 51.
    res = simulate(trace, horovod(threshold_bytes=100, cycle_us=10))
    assert res.unit_start_us == (5, 16, 37)
    assert res.iteration_us == 51


def test_horovod_nccl_style_thread_keeps_its_cycle_while_units_run() -> None:
    trace = cycle_trace(20)
    # Tick 5: [w3] 5-16. The thread does not wait for it: next grid point 15 takes w2 (ready
    # 10), queued behind w3: 16-27. w1 (ready 30) waits for the tick at 35: 35-46.
    # fw1 46 .. fw3 ends 49 (the synchronous thread of the test above: 51).
    res = simulate(trace, horovod(threshold_bytes=100, cycle_us=10, synchronous=False))
    assert res.unit_start_us == (5, 16, 35)
    assert res.iteration_us == 49


def test_horovod_rejects_credit() -> None:
    with pytest.raises(InputError, match="credit"):
        simulate(tiny(), "horovod", options=SimOptions(credit=2))


def test_ddp_buckets_first_bucket_small() -> None:
    trace = cycle_trace(5)
    # Ready order w3, w2, w1 (10 bytes each). First bucket closes at >= 5 bytes: [w3]; then
    # [w2, w1] closes at 20 >= 15. Bucket 0 ready 5: 5-16; bucket 1 ready 15: 16-37.
    # Barrier: fw1 37 .. fw3 ends 40.
    res = simulate(trace, ddp(bucket_cap_bytes=15, first_bucket_bytes=5))
    assert [u.tensors for u in res.units] == [("w3",), ("w2", "w1")]
    assert res.unit_start_us == (5, 16)
    assert res.iteration_us == 40
    assert res.knobs["buckets"] == 2


def test_ddp_default_puts_small_model_in_one_bucket() -> None:
    # 24 bytes < 1 MiB: one bucket, ready at 20, 20-44; fw 44-54.
    res = simulate(tiny(), "ddp")
    assert len(res.units) == 1
    assert res.iteration_us == 54


def test_one_compute_stream_serialises_parallel_ops() -> None:
    trace = chain_trace(
        [("a", "backward", 10), ("b", "backward", 10), ("c", "forward", 5)],
        [("w", 1, "a", ("c",))],
        deps={"a": (), "b": (), "c": ("a", "b")},
    )
    # Ideal: a, b 0-10, w 10-11, c 11-16.
    assert simulate(trace, "tictac").iteration_us == 16
    # One stream, trace order breaks the tie: a 0-10, b 10-20, c 20-25.
    res = simulate(trace, "tictac", options=SimOptions(one_compute_stream=True))
    assert res.iteration_us == 25
    assert res.op_start_us == (0, 10, 20)


def test_one_compute_stream_orders_by_ready_time() -> None:
    # x (deps none) and the consumer c of w: c is ready at 11 (w done), y becomes ready at 10
    # after a. One stream: a 0-10; y ready at 10 runs 10-30 although c (ready 11) is first in
    # the trace; c 30-35.
    trace = chain_trace(
        [("a", "backward", 10), ("c", "forward", 5), ("y", "forward", 20)],
        [("w", 1, "a", ("c",))],
        deps={"a": (), "c": ("a",), "y": ("a",)},
    )
    res = simulate(trace, "tictac", options=SimOptions(one_compute_stream=True))
    assert res.op_start_us == (0, 30, 10)
    assert res.iteration_us == 35


def test_options_validate_and_name_the_option() -> None:
    with pytest.raises(InputError, match="credit"):
        SimOptions(credit=0)
    with pytest.raises(InputError, match="barrier"):
        SimOptions(barrier="yes")  # type: ignore[arg-type]
    with pytest.raises(InputError, match="policy"):
        simulate(tiny(), "no-such-policy")


def test_explicit_options_override_policy_defaults() -> None:
    res = simulate(tiny(), "fifo", options=SimOptions(barrier=False))
    assert res.options == SimOptions(
        credit=1, barrier=False, one_compute_stream=False, agreed_readiness=False, queued=False
    )


def test_unit_naming_an_unknown_tensor_is_an_input_error() -> None:
    units = (Unit(priority=0, slices=(sl("nope", 0, 4),)),)
    with pytest.raises(InputError, match=r"units\[0\]"):
        simulate(tiny(), units_policy(units))


def test_tensor_carried_by_no_unit_is_an_input_error() -> None:
    units = (Unit(priority=0, slices=(sl("layer1.weight", 0, 4),)),)
    with pytest.raises(InputError, match=r"layer2\.weight"):
        simulate(tiny(), units_policy(units))


def test_lemma1_violation_is_refused() -> None:
    # bw.layer1 (a producer) depends on fw.layer2 (a consumer).
    bad = tiny()
    ops = list(bad.ops)
    ops[1] = dataclasses.replace(ops[1], deps=("bw.layer2", "fw.layer2"))
    ops[3] = dataclasses.replace(ops[3], deps=())
    with pytest.raises(InputError, match="Lemma 1"):
        simulate(dataclasses.replace(bad, ops=tuple(ops)), "fifo")


def test_compare_runs_every_policy() -> None:
    results = compare(tiny())
    assert set(results) == set(POLICIES)
    assert results["fifo"].iteration_us == 44
    assert results["bytescheduler-tuned"].iteration_us <= results["bytescheduler"].iteration_us


def test_compare_options_override_every_policy_and_subset() -> None:
    results = compare(tiny(), options=SimOptions(barrier=True), policies=["tictac", "p3"])
    assert set(results) == {"tictac", "p3"}
    # Barrier on: comm ends at 34, forward 34-44.
    assert all(r.iteration_us == 44 and r.options.barrier for r in results.values())
    with pytest.raises(InputError, match="nope"):
        compare(tiny(), policies=["nope"])
