"""The runtime's packing of a unit's gradients into one buffer, scaled as DDP scales them
(``pack_pieces``), and the copy back after the reduction (``unpack_pieces``).

On the CPU each piece is written by one multiply straight from its gradient into the buffer,
instead of a copy and then a scale of the whole buffer. Both must give the same bits for every
dtype, scale and value (infinities, signed zeros, subnormals): the runtime's results are
compared bitwise with DDP's. A NaN stays a NaN, though not always with the same payload: torch's
in-place and out-of-place bfloat16 multiplies quiet it differently (DDP never promised a NaN's
payload either).
"""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from pace.runtime import pack_pieces, unpack_pieces

_BITS = {
    torch.float64: torch.int64,
    torch.float32: torch.int32,
    torch.float16: torch.int16,
    torch.bfloat16: torch.int16,
}
# 1 / size for 1 to 8 ranks (DDP's pre-scale), and Horovod's 1.0 (it averages after the sum).
_SCALES = [1.0 / n for n in range(1, 9)]
_SPECIAL = [0.0, -0.0, math.inf, -math.inf, math.nan, 1e-40, -1e-45, 3.0e38, 65504.0, 1e-7, 6e-8]


def _bits(t: torch.Tensor) -> list[int | str]:
    """Each element's bit pattern, every NaN as one token."""
    nan = t.isnan().tolist()
    return ["nan" if n else b for n, b in zip(nan, t.view(_BITS[t.dtype]).tolist(), strict=True)]


_VALUES = st.lists(
    st.one_of(st.floats(allow_nan=True, allow_infinity=True), st.sampled_from(_SPECIAL)),
    min_size=1,
    max_size=50,
)


@settings(max_examples=200, deadline=None)
@given(
    sizes=st.lists(st.integers(1, 40), min_size=1, max_size=6),
    dtype=st.sampled_from(list(_BITS)),
    scale=st.sampled_from(_SCALES),
    values=_VALUES,
)
def test_the_buffer_gets_the_bits_of_scaling_each_gradient_in_place(
    sizes: list[int], dtype: torch.dtype, scale: float, values: list[float]
) -> None:
    """DDP's reducer multiplies each gradient by 1 / size as it copies it into its bucket;
    the packed buffer must hold those bits, whichever way it is written."""
    numel = sum(sizes)
    flat = torch.tensor((values * numel)[:numel], dtype=torch.float64).to(dtype)
    grads = list(flat.split(sizes))
    before = [_bits(g) for g in grads]
    want = torch.cat([g.clone().mul_(scale) for g in grads])
    out = torch.full((numel + 3,), 7.0, dtype=dtype)

    pack_pieces(grads, out[:numel], scale)

    assert _bits(out[:numel]) == _bits(want)
    assert _bits(out[numel:]) == _bits(torch.full((3,), 7.0, dtype=dtype))  # nothing past it
    assert [_bits(g) for g in grads] == before  # the gradients themselves are not scaled


@settings(max_examples=100, deadline=None)
@given(
    sizes=st.lists(st.integers(1, 40), min_size=1, max_size=6),
    dtype=st.sampled_from(list(_BITS)),
    values=_VALUES,
)
def test_the_copy_back_writes_each_span_into_its_gradient_in_place(
    sizes: list[int], dtype: torch.dtype, values: list[float]
) -> None:
    numel = sum(sizes)
    buf = torch.tensor((values * numel)[:numel], dtype=torch.float64).to(dtype)
    spans, at = [], 0
    for n in sizes:
        spans.append((at, at + n))
        at += n
    grads = [torch.full((b - a,), 7.0, dtype=dtype) for a, b in spans]
    storages = [g.untyped_storage().data_ptr() for g in grads]

    unpack_pieces(buf, [(g, a, b) for g, (a, b) in zip(grads, spans, strict=True)])

    for g, (a, b) in zip(grads, spans, strict=True):
        assert _bits(g) == _bits(buf[a:b])
    # In place: the gradients are the same tensors, not rebound.
    assert [g.untyped_storage().data_ptr() for g in grads] == storages


def test_a_unit_reduced_in_place_has_nothing_to_copy_back() -> None:
    buf = torch.randn(1000)
    want = buf.clone()
    unpack_pieces(buf, [])
    assert _bits(buf) == _bits(want)


def test_the_benchmark_compares_both_ways_on_the_same_bits(
    capsys: pytest.CaptureFixture[str],
) -> None:
    from benchmarks.bench_copy_back import main

    assert main(["--rounds", "2", "--unit-mib", "16"]) == 0
    out = capsys.readouterr().out
    assert "multiply-into" in out
    assert "copy+scale" in out
    assert "same bits in every buffer: yes" in out
