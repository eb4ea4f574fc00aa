"""pace.io: strict loading, round trips, the digest."""

from __future__ import annotations

import gzip
import json
import math
import random
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pace.errors import InputError
from pace.io import (
    load_json,
    load_schedule,
    load_trace,
    save_schedule,
    save_trace,
    schedule_from_dict,
    schedule_to_dict,
    trace_digest,
    trace_from_dict,
    trace_to_dict,
)
from pace.ir import CommModel, Op, Schedule, Slice, Tensor, Trace, Unit
from pace.synth import random_trace
from tests.strategies import traces

DATA = Path(__file__).parent / "data"
TINY = DATA / "tiny.trace.json"


def tiny() -> Trace:
    return load_trace(TINY)


def test_tiny_example_loads_with_expected_content() -> None:
    t = tiny()
    assert t.model == "tiny-2-layer"
    assert [op.name for op in t.ops] == ["bw.layer2", "bw.layer1", "fw.layer1", "fw.layer2"]
    assert t.ops[1].deps == ("bw.layer2",)
    assert t.tensor_map()["layer2.weight"].size_bytes == 20
    assert t.tensor_map()["layer1.weight"].consumers == ("fw.layer1",)
    assert t.comm == CommModel(workers=2, alpha_us=0.0, beta_us_per_byte=1.0)
    assert t.meta["source"].startswith("hand-written")


@settings(max_examples=40)
@given(trace=traces(), gz=st.booleans())
def test_round_trip_file(tmp_path_factory: pytest.TempPathFactory, trace: Trace, gz: bool) -> None:
    path = tmp_path_factory.mktemp("rt") / ("t.json.gz" if gz else "t.json")
    save_trace(trace, path)
    back = load_trace(path)
    assert back == trace
    assert back.meta == trace.meta
    assert trace_digest(back) == trace_digest(trace)


@settings(max_examples=40)
@given(trace=traces())
def test_round_trip_dict(trace: Trace) -> None:
    assert trace_from_dict(trace_to_dict(trace)) == trace


def test_round_trip_keeps_samples_and_exact_floats(tmp_path: Path) -> None:
    t = Trace(
        model="m",
        ops=(
            Op(name="a", phase="backward", duration_us=0.1 + 0.2),
            # The smallest nonzero time allowed (trace-format.md, "Bounds"), plus one ulp.
            Op(name="b", phase="forward", duration_us=math.nextafter(1e-100, 1.0), deps=("a",)),
        ),
        tensors=(Tensor(name="w", size_bytes=2**40, producer="a", consumers=("b",)),),
        comm=CommModel(
            workers=3,
            alpha_us=12.5,
            beta_us_per_byte=1 / 3,
            algorithm="tree",
            samples=((0, 10.0), (1024, 11.25)),
        ),
        meta={"nested": {"list": [1, 2.5, None, "x"]}},
    )
    save_trace(t, tmp_path / "t.json")
    back = load_trace(tmp_path / "t.json")
    assert back == t
    assert back.ops[0].duration_us == 0.1 + 0.2
    assert back.comm.samples == ((0, 10.0), (1024, 11.25))
    assert back.meta == t.meta


def test_gzip_is_detected_by_magic_and_output_is_reproducible(tmp_path: Path) -> None:
    t = tiny()
    save_trace(t, tmp_path / "a.json.gz")
    save_trace(t, tmp_path / "b.json.gz")
    raw = (tmp_path / "a.json.gz").read_bytes()
    assert raw[:2] == b"\x1f\x8b"
    assert raw == (tmp_path / "b.json.gz").read_bytes()
    # A gzip file without the .gz suffix still loads.
    (tmp_path / "c.json").write_bytes(raw)
    assert load_trace(tmp_path / "c.json") == t
    assert json.loads(gzip.decompress(raw))["format"] == "pace.trace"


def _shuffle_keys(obj: object, rng: random.Random) -> object:
    if isinstance(obj, dict):
        items = list(obj.items())
        rng.shuffle(items)
        return {k: _shuffle_keys(v, rng) for k, v in items}
    if isinstance(obj, list):
        return [_shuffle_keys(v, rng) for v in obj]
    return obj


@settings(max_examples=30)
@given(trace=traces(max_layers=6), seed=st.integers(0, 1000))
def test_digest_ignores_key_order_whitespace_and_number_spelling(trace: Trace, seed: int) -> None:
    obj = trace_to_dict(trace)
    shuffled = _shuffle_keys(obj, random.Random(seed))
    reparsed = json.loads(json.dumps(shuffled, indent=3))
    assert trace_digest(trace_from_dict(reparsed)) == trace_digest(trace)
    # 10 and 10.0 are the same duration.
    for op in reparsed["ops"]:
        op["duration_us"] = float(op["duration_us"])
    assert trace_digest(trace_from_dict(reparsed)) == trace_digest(trace)


def test_digest_ignores_model_meta_and_comm() -> None:
    import dataclasses

    t = tiny()
    d = trace_digest(t)
    assert d.startswith("sha256:")
    assert len(d) == len("sha256:") + 64
    assert trace_digest(dataclasses.replace(t, model="other", meta={"x": 1})) == d
    comm = CommModel(workers=64, alpha_us=99.0, beta_us_per_byte=0.5, samples=((1, 1.0),))
    assert trace_digest(dataclasses.replace(t, comm=comm)) == d


def test_digest_covers_every_computation_field() -> None:
    import dataclasses

    t = tiny()
    d = trace_digest(t)
    op0, t0 = t.ops[0], t.tensors[0]
    variants = [
        dataclasses.replace(t, ops=(dataclasses.replace(op0, duration_us=10.5), *t.ops[1:])),
        dataclasses.replace(t, ops=(dataclasses.replace(op0, phase="other"), *t.ops[1:])),
        dataclasses.replace(t, ops=(dataclasses.replace(op0, name="x"), *t.ops[1:])),
        dataclasses.replace(
            t, ops=(*t.ops[:3], dataclasses.replace(t.ops[3], deps=("fw.layer1", "bw.layer2")))
        ),
        dataclasses.replace(t, tensors=(dataclasses.replace(t0, size_bytes=21), *t.tensors[1:])),
        dataclasses.replace(t, tensors=(dataclasses.replace(t0, name="y"), *t.tensors[1:])),
        dataclasses.replace(
            t, tensors=(dataclasses.replace(t0, producer="bw.layer1"), *t.tensors[1:])
        ),
        dataclasses.replace(
            t,
            tensors=(dataclasses.replace(t0, consumers=("fw.layer1",)), *t.tensors[1:]),
        ),
        # Order is part of the digest (documented): the same ops listed differently.
        dataclasses.replace(t, ops=(t.ops[1], t.ops[0], *t.ops[2:])),
        dataclasses.replace(t, tensors=tuple(reversed(t.tensors))),
    ]
    digests = {trace_digest(v) for v in variants}
    assert d not in digests
    assert len(digests) == len(variants)


def test_digest_is_pinned_for_the_tiny_example() -> None:
    # A change here breaks every schedule file already written: bump the digest version instead.
    assert trace_digest(tiny()) == (
        "sha256:2712cbcb1725183908695099325d06b0ff433ed0640a71f12a40410ce569c2e9"
    )


def _schedule(t: Trace) -> Schedule:
    return Schedule(
        trace_digest=trace_digest(t),
        cost_model=CommModel(workers=2, alpha_us=0.0, beta_us_per_byte=1.0),
        units=(
            Unit(
                priority=10, slices=(Slice(tensor="layer2.weight", offset_bytes=0, size_bytes=10),)
            ),
            Unit(
                priority=20, slices=(Slice(tensor="layer1.weight", offset_bytes=0, size_bytes=4),)
            ),
            Unit(
                priority=24.5,
                slices=(Slice(tensor="layer2.weight", offset_bytes=10, size_bytes=10),),
            ),
        ),
        predicted_iteration_us=39.0,
        meta={"solver": "exact"},
    )


@pytest.mark.parametrize("name", ["s.json", "s.json.gz"])
def test_schedule_round_trip(tmp_path: Path, name: str) -> None:
    t = tiny()
    s = _schedule(t)
    save_schedule(s, tmp_path / name)
    back = load_schedule(tmp_path / name, trace=t)
    assert back == s
    assert back.meta == {"solver": "exact"}
    assert schedule_from_dict(schedule_to_dict(s)) == s


def test_schedule_json_uses_contract_keys(tmp_path: Path) -> None:
    save_schedule(_schedule(tiny()), tmp_path / "s.json")
    obj = json.loads((tmp_path / "s.json").read_text())
    assert obj["format"] == "pace.schedule"
    assert obj["version"] == 1
    assert set(obj["cost_model"]) >= {"alpha_us", "beta_us_per_byte", "workers"}
    assert obj["units"][0] == {
        "priority": 10,
        "slices": [{"tensor": "layer2.weight", "offset": 0, "bytes": 10}],
    }
    assert obj["predicted_iteration_us"] == 39


def test_unknown_keys_are_ignored_everywhere() -> None:
    obj = json.loads(TINY.read_text())
    obj["future_top"] = {"x": 1}
    obj["ops"][0]["future_op_field"] = [1, 2]
    obj["tensors"][0]["layout"] = "strided"
    obj["comm"]["topology"] = "fat-tree"
    assert trace_from_dict(obj) == tiny()


def test_optional_keys_have_documented_defaults() -> None:
    obj = json.loads(TINY.read_text())
    del obj["model"], obj["meta"], obj["comm"]["algorithm"]
    del obj["ops"][0]["deps"]
    t = trace_from_dict(obj)
    assert t.model == ""
    assert t.meta == {}
    assert t.comm.algorithm == "ring"
    assert t.ops[0].deps == ()


def test_load_json_errors_name_the_file(tmp_path: Path) -> None:
    missing = tmp_path / "nope.json"
    with pytest.raises(InputError, match=r"nope\.json: cannot read file"):
        load_json(missing)


def test_duplicate_json_key_is_refused_with_its_path(tmp_path: Path) -> None:
    p = tmp_path / "d.json"
    p.write_text('{"format": "pace.trace", "ops": [{"name": "a", "name": "b"}]}')
    with pytest.raises(InputError, match=r"d\.json: ops\[0\]: duplicate key 'name'"):
        load_json(p)


@pytest.mark.parametrize("token", ["NaN", "Infinity", "-Infinity", "1e400"])
def test_non_finite_numbers_are_refused_with_their_path(tmp_path: Path, token: str) -> None:
    p = tmp_path / "n.json"
    p.write_text('{"meta": {"x": [1, %s]}}' % token)  # noqa: UP031
    with pytest.raises(InputError, match=r"n\.json: meta\.x\[1\]: .*not a valid JSON number"):
        load_json(p)


def test_loader_runs_verify(tmp_path: Path) -> None:
    obj = json.loads(TINY.read_text())
    obj["tensors"][1]["producer"] = "bw.fc"
    p = tmp_path / "trace.json"
    p.write_text(json.dumps(obj))
    with pytest.raises(InputError) as info:
        load_trace(p)
    assert str(info.value) == f"{p}: tensors[1].producer: op 'bw.fc' does not exist"
    # verify=False returns the parsed (unchecked) trace.
    assert load_trace(p, verify=False).tensors[1].producer == "bw.fc"


def test_save_refuses_non_json_meta(tmp_path: Path) -> None:
    import dataclasses

    t = dataclasses.replace(tiny(), meta={"bad": float("nan")})
    with pytest.raises(InputError, match="cannot write as JSON"):
        save_trace(t, tmp_path / "x.json")


def test_large_trace_round_trip(tmp_path: Path) -> None:
    t = random_trace(seed=3, n_layers=400, ops_per_layer=6)
    save_trace(t, tmp_path / "big.json.gz")
    assert load_trace(tmp_path / "big.json.gz") == t


def test_unwritable_path_is_an_input_error(tmp_path: Path) -> None:
    target = tmp_path / "no" / "such" / "dir" / "t.json"
    with pytest.raises(InputError, match=r"t\.json: cannot write file"):
        save_trace(tiny(), target)
