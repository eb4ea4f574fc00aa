"""The runtime's averaging of a reduced unit into its gradients (``average_pieces``, issue 15).

On the CPU each packed piece is written by one multiply straight into its gradient, instead of
scaling the whole buffer and then copying it back. Both must give the same bits for every
dtype, scale and value (infinities, signed zeros, subnormals): the runtime's results are
compared bitwise with DDP's and Horovod's. A NaN stays a NaN, though not always with the same
payload: torch's in-place and out-of-place bfloat16 multiplies quiet it differently (DDP, which
divides before it sums, never promised a NaN's payload either).
"""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from pace.runtime import average_pieces

_BITS = {
    torch.float64: torch.int64,
    torch.float32: torch.int32,
    torch.float16: torch.int16,
    torch.bfloat16: torch.int16,
}
# 1 / size for 1 to 8 ranks, and Horovod's 1.0 (it averages itself).
_SCALES = [1.0 / n for n in range(1, 9)]
_SPECIAL = [0.0, -0.0, math.inf, -math.inf, math.nan, 1e-40, -1e-45, 3.0e38, 65504.0, 1e-7]


def _bits(t: torch.Tensor) -> list[int | str]:
    """Each element's bit pattern, every NaN as one token."""
    nan = t.isnan().tolist()
    return ["nan" if n else b for n, b in zip(nan, t.view(_BITS[t.dtype]).tolist(), strict=True)]


def _reference(
    buf: torch.Tensor, spans: list[tuple[int, int]], scale: float
) -> tuple[list[torch.Tensor], torch.Tensor]:
    """What the runtime did before: scale the whole buffer in place (not at all where the
    backend averaged itself, a scale of 1), then copy each piece."""
    ref = buf.clone()
    if scale != 1.0:
        ref.mul_(scale)
    return [ref[a:b].clone() for a, b in spans], ref


@settings(max_examples=200, deadline=None)
@given(
    sizes=st.lists(st.integers(1, 40), min_size=1, max_size=6),
    extra=st.integers(0, 9),
    dtype=st.sampled_from(list(_BITS)),
    scale=st.sampled_from(_SCALES),
    values=st.lists(
        st.one_of(st.floats(allow_nan=True, allow_infinity=True), st.sampled_from(_SPECIAL)),
        min_size=1,
        max_size=50,
    ),
)
def test_the_pieces_and_the_maps_get_the_bits_of_scaling_then_copying(
    sizes: list[int], extra: int, dtype: torch.dtype, scale: float, values: list[float]
) -> None:
    numel = sum(sizes) + extra
    buf = torch.tensor((values * numel)[:numel], dtype=torch.float64).to(dtype)
    spans, at = [], 0
    for n in sizes:
        spans.append((at, at + n))
        at += n
    want_pieces, want_buf = _reference(buf, spans, scale)
    grads = [torch.full((b - a,), 7.0, dtype=dtype) for a, b in spans]
    storages = [g.untyped_storage().data_ptr() for g in grads]

    average_pieces(buf, [(g, a, b) for g, (a, b) in zip(grads, spans, strict=True)], scale)

    for got, want in zip(grads, want_pieces, strict=True):
        assert _bits(got) == _bits(want)
    # In place: the gradients are the same tensors, not rebound.
    assert [g.untyped_storage().data_ptr() for g in grads] == storages
    # The readiness and used maps after the pieces are read as averages.
    assert _bits(buf[at:]) == _bits(want_buf[at:])


@pytest.mark.parametrize("scale", [0.5, 1.0 / 3.0, 1.0])
def test_a_unit_reduced_in_place_is_scaled_in_place(scale: float) -> None:
    buf = torch.randn(1000)
    want = buf.clone().mul_(scale)
    average_pieces(buf, [], scale)
    assert _bits(buf) == _bits(want)


def test_the_benchmark_compares_both_ways_on_the_same_bits(
    capsys: pytest.CaptureFixture[str],
) -> None:
    from benchmarks.bench_copy_back import main

    assert main(["--rounds", "2", "--unit-mib", "16"]) == 0
    out = capsys.readouterr().out
    assert "multiply-into" in out
    assert "scale+copy" in out
    assert "same bits in every gradient: yes" in out
