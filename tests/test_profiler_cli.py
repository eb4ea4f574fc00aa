"""``pace profile`` / ``pace profile-comm`` end to end, the comm fit, and the window algorithms."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from pace.cli import main
from pace.errors import InputError
from pace.io import load_trace
from pace.profiler.comm import (
    _reps_for,
    fit_comm,
    load_comm,
    poor_fit_warning,
    sizes_covering,
    sweep_order,
)
from pace.profiler.window import _durations, _resolve
from pace.verify import verify_trace

pytest.importorskip("torch")


@pytest.mark.torch
def test_profile_cli_on_a_model_it_was_not_tuned_on(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "mnv3.json.gz"
    rc = main(
        [
            "profile",
            "--model",
            "torchvision:mobilenet_v3_small",
            "--batch-size",
            "2",
            "--image-size",
            "64",
            "--iters",
            "2",
            "--warmup",
            "1",
            "--workers",
            "4",
            "--bandwidth-gbps",
            "25",
            "--no-progress",
            "--json",
            "-o",
            str(out),
        ]
    )
    assert rc == 0
    summary = json.loads(capsys.readouterr().out)
    trace = load_trace(out)
    verify_trace(trace)
    import torchvision

    model = torchvision.models.mobilenet_v3_small(weights=None)
    sizes = {n: p.numel() * p.element_size() for n, p in model.named_parameters()}
    assert {t.name: t.size_bytes for t in trace.tensors} == sizes
    assert summary["tensors"] == len(sizes)
    assert trace.comm.workers == 4
    # 25 Gbps ring, 4 workers: 2*(3/4) bytes per byte at 3125 bytes/us.
    assert trace.comm.beta_us_per_byte == pytest.approx(1.5 / 3125)
    assert trace.meta["command"].startswith("pace profile --model torchvision:mobilenet_v3_small")
    assert trace.meta["batch_size"] == 2

    # ... and the compiler takes it.
    from pace.compiler import compile_trace

    result = compile_trace(trace, baselines=False)
    assert result.predicted_iteration_us >= result.lower_bound_us > 0


@pytest.mark.torch
@pytest.mark.parametrize(
    ("argv", "needle"),
    [
        (["--model", "torchvision:resnet5"], "--model: unknown torchvision"),
        (["--model", "pace:gpt9"], "--model: unknown model"),
        (["--model", "pace:transformer", "--iters", "0"], "--iters: must be >= 1"),
        (["--model", "pace:transformer", "--batch-size", "0"], "--batch-size: must be >= 1"),
        (["--model", "pace:transformer", "--comm", "missing.json"], "missing.json"),
        (["--model", "pace:transformer", "--bandwidth-gbps", "-1"], "bandwidth"),
    ],
)
def test_profile_cli_bad_input_exits_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], argv: list[str], needle: str
) -> None:
    rc = main(["profile", *argv, "--no-progress", "-o", str(tmp_path / "t.json")])
    err = capsys.readouterr().err
    assert rc == 2
    assert needle in err
    assert len(err.strip().splitlines()) == 1
    assert not (tmp_path / "t.json").exists()


def test_profile_comm_cli_bad_input(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["profile-comm", "--workers", "1", "-o", "x.json"]) == 2
    assert "--workers" in capsys.readouterr().err
    assert main(["profile-comm", "--sizes", "12Q", "-o", "x.json"]) == 2
    assert "--sizes" in capsys.readouterr().err
    # Horovod's own path is measured by Horovod only.
    assert main(["profile-comm", "--framework", "-o", "x.json"]) == 2
    assert "--framework" in capsys.readouterr().err


@pytest.mark.multiprocess
@pytest.mark.slow
def test_gloo_benchmark_with_two_real_processes(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "comm.json"
    rc = main(
        [
            "profile-comm",
            "--backend",
            "gloo",
            "--workers",
            "2",
            "--sizes",
            "4K,64K,1M,4M",
            "--reps",
            "3",
            "--json",
            "-o",
            str(out),
        ]
    )
    assert rc == 0
    obj = json.loads(out.read_text())
    assert obj["format"] == "pace.comm"
    assert [b for b, _ in obj["samples"]] == [4096, 65536, 2**20, 4 * 2**20]
    assert all(us > 0 for _, us in obj["samples"])
    model = load_comm(out)
    assert model.workers == 2
    # The slope itself is the host's business (a loaded CI host once timed 4 KiB slower than
    # 4 MiB); what the tool owes is a non-negative fit, and a warning whenever it is not usable.
    assert model.beta_us_per_byte >= 0
    assert model.alpha_us >= 0
    assert "r2" in obj["fit"]
    captured = capsys.readouterr()
    printed = json.loads(captured.out)
    assert printed["beta_us_per_byte"] == model.beta_us_per_byte
    poor = model.beta_us_per_byte == 0 or obj["fit"]["r2"] < 0.5
    assert ("the fit is poor" in captured.err) == poor


@given(
    sizes=st.lists(st.integers(4, 2**28), min_size=1, max_size=8, unique=True),
    reps=st.integers(1, 40),
)
def test_sweep_order_interleaves_every_size(sizes: list[int], reps: int) -> None:
    order = sweep_order(sizes, reps)
    counts = [sum(1 for i, _ in order if i == k) for k in range(len(sizes))]
    assert counts == [_reps_for(s, reps) for s in sizes]
    # Round-robin: a size's r-th call comes after every other size's (r-1)-th call.
    for pos, (i, r) in enumerate(order):
        assert all(
            (j, r - 1) in order[:pos] for j in range(len(sizes)) if r >= 1 and r <= counts[j]
        )
        assert (i, r) not in order[:pos]


def test_poor_fit_warning_names_a_flat_fit_and_spares_a_good_one() -> None:
    good = fit_comm([(b, 30.0 + 0.002 * b) for b in (4096, 65536, 2**20)], workers=2)
    assert poor_fit_warning(good) is None
    flat = fit_comm([(4096, 4346.0), (65536, 3290.0), (2**20, 2707.0), (2**22, 2440.0)], workers=2)
    assert flat.model.beta_us_per_byte == 0
    why = poor_fit_warning(flat)
    assert why is not None
    assert "--reps" in why
    assert "r2=" in why


def test_fit_recovers_a_linear_model() -> None:
    samples = [(b, 30.0 + 0.002 * b) for b in (1024, 8192, 65536, 2**20)]
    fit = fit_comm(samples, workers=2)
    assert fit.model.alpha_us == pytest.approx(30.0, rel=1e-6)
    assert fit.model.beta_us_per_byte == pytest.approx(0.002, rel=1e-6)
    assert fit.r2 == pytest.approx(1.0)


def test_load_comm_errors(tmp_path: Path) -> None:
    bad = tmp_path / "c.json"
    bad.write_text(json.dumps({"format": "pace.comm", "workers": 2, "alpha_us": -1}))
    with pytest.raises(InputError, match="beta_us_per_byte"):
        load_comm(bad)
    bad.write_text(
        json.dumps({"format": "pace.comm", "workers": 2, "alpha_us": -1, "beta_us_per_byte": 0})
    )
    with pytest.raises(InputError, match="alpha_us"):
        load_comm(bad)
    bad.write_text("{")
    with pytest.raises(InputError, match="JSON"):
        load_comm(bad)


def test_sizes_covering_spans_the_tensors() -> None:
    sizes = sizes_covering([64, 4096, 411_041_792])
    assert sizes[0] == 64
    assert sizes[-1] == 411_041_792
    assert sizes == sorted(sizes)
    assert all(s % 4 == 0 for s in sizes)


# --- the window algorithms ----------------------------------------------------------------------


@st.composite
def _dags(draw: st.DrawFn) -> tuple[list[tuple[int, ...]], list[bool]]:
    n = draw(st.integers(1, 14))
    deps = [
        tuple(sorted(draw(st.sets(st.integers(0, i - 1), max_size=3)))) if i else ()
        for i in range(n)
    ]
    kept = draw(st.lists(st.booleans(), min_size=n, max_size=n))
    return deps, kept


@given(_dags())
def test_resolve_sees_through_folded_ops(dag: tuple[list[tuple[int, ...]], list[bool]]) -> None:
    deps, kept = dag
    resolved = _resolve(deps, kept)
    for i in range(len(deps)):
        # Brute force: kept ops reachable backwards through folded ops only.
        want: set[int] = set()
        stack = list(deps[i])
        seen: set[int] = set()
        while stack:
            d = stack.pop()
            if d in seen:
                continue
            seen.add(d)
            if kept[d]:
                want.add(d)
            else:
                stack.extend(deps[d])
        assert set(resolved[i]) == want


@given(
    st.lists(st.tuples(st.floats(0, 1e4), st.floats(0, 1e4)), min_size=1, max_size=12),
    st.data(),
)
def test_spans_tile_the_pass(gaps: list[tuple[float, float]], data: st.DataObject) -> None:
    # Ops run one after another: op i starts after a gap, runs its kernel; no bookkeeping.
    start: list[float] = []
    end: list[float] = []
    t = 0.0
    for gap, kernel in gaps:
        t += gap
        start.append(t)
        t += kernel
        end.append(t)
    n = len(gaps)
    kept = sorted(data.draw(st.sets(st.integers(0, n - 1), min_size=1)))
    book = [0.0] * n
    spans = _durations(
        kept=kept, start=start, end=end, book=book, begin_ns=0.0, end_ns=t, timing="span"
    )
    assert sum(spans) == pytest.approx(t, abs=1e-6)
    kernels = _durations(
        kept=kept, start=start, end=end, book=book, begin_ns=0.0, end_ns=t, timing="kernel"
    )
    assert sum(kernels) == pytest.approx(sum(e - s for s, e in zip(start, end, strict=True)))


@pytest.mark.horovod
@pytest.mark.multiprocess
@pytest.mark.slow
def test_horovod_benchmark_with_two_real_processes(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    pytest.importorskip("horovod.torch", reason="horovod is built by `make horovod`")
    out = tmp_path / "comm.json"
    rc = main(
        [
            "profile-comm",
            "--backend",
            "horovod",
            "--workers",
            "2",
            "--sizes",
            "4K,1M,16M",
            "--reps",
            "3",
            "--framework",
            "-o",
            str(out),
        ]
    )
    assert rc == 0
    obj = json.loads(out.read_text())
    assert obj["backend"] == "horovod"
    assert [b for b, _ in obj["samples"]] == [4096, 2**20, 16 * 2**20]
    # --framework: a second sweep under Horovod's defaults, its fit in comm.framework, which
    # `pace profile --comm` carries into the trace.
    assert [b for b, _ in obj["meta"]["framework_samples"]] == [4096, 2**20, 16 * 2**20]
    path = load_comm(out).framework
    assert path is not None
    assert path.backend == "horovod"
    assert path.alpha_us >= 0
    assert path.beta_us_per_byte >= 0
    # Under the runtime's settings also batches of tiny tensors issued at once: every count
    # timed, the further call's cost stored within [0, alpha] (what the simulator charges a
    # cycle's calls after its first), and said.
    from pace.profiler._hvd_bench import BATCH_COUNTS

    batches = obj["meta"]["batches"]
    assert sorted(int(k) for k in batches["medians_us"]) == list(BATCH_COUNTS)
    assert all(v > 0 for v in batches["medians_us"].values())
    model = load_comm(out)
    assert model.batched_alpha_us is not None
    assert 0 <= model.batched_alpha_us <= model.alpha_us
    share = batches["further_call_us"] / batches["first_call_us"]
    expected = model.alpha_us * min(max(0.0, share), 1.0)
    assert model.batched_alpha_us == pytest.approx(expected, rel=1e-3, abs=0.05)  # rounded
    beta = model.beta_us_per_byte
    assert beta >= 0  # its size is the host's business; a flat fit must be flagged
    poor = beta == 0 or obj["fit"]["r2"] < 0.5
    said = capsys.readouterr()
    assert ("the fit is poor" in said.err) == poor
    assert f"batched_alpha_us={model.batched_alpha_us:.1f}" in said.out
