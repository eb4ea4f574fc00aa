"""Bounds of the domain (docs/trace-format.md, "Bounds").

Generous for any real training job, yet small enough that every sum and product the stages
compute stays exact or finite: 2**20 tensors of 2**48 bytes would overflow numpy's int64, a
1e308 us duration turns sums into inf and differences into NaN, and P3/ByteScheduler loop over
2**70 bytes of partitions for ever.

``pace.io`` holds files to them (and re-exports every name, where callers have always imported
them from), ``pace.verify`` a Trace built in memory, the CLI its flag values. This module imports
nothing, so that all three can use it without importing each other.
"""

from __future__ import annotations

MAX_FILE_BYTES = 2**28
"""256 MiB of JSON text (after gunzip): a 50,000-op trace takes 6 MB."""
MAX_JSON_INT = 2**63 - 1
"""Every JSON integer, anywhere (``meta`` included): what 64-bit readers in other languages can
hold; Python itself refuses to convert literals of more than 4,300 digits."""
MAX_ITEMS = 2**20
"""ops, tensors, units and comm samples: at most this many each (a large transformer profiled
per kernel has about 10**5 ops)."""
MAX_SLICES = 2**22
"""slices of all units of a schedule together."""
MAX_TENSOR_BYTES = 2**48
"""256 TiB: bound on one tensor and on all tensors of a trace together (64 trillion fp32
parameters; no data-parallel worker holds a gradient anywhere near this)."""
MAX_DURATION_US = 86_400e6
"""One day in microseconds: bound on an op's duration, ``alpha_us`` and a sample's time; a
training iteration window is seconds."""
MIN_NONZERO_US = 1e-100
"""A nonzero duration, ``alpha_us`` or sample time is at least this: far below any physical time,
yet the ratio of a day to it stays finite (a day over 1e-300 us, or a subnormal, is ``inf``), and
above a least-squares fit's numerical zero (1e-16), which pace writes into files itself."""
MAX_BETA_US_PER_BYTE = 1e6
"""One byte per second: slower than any link a gradient was ever all-reduced over."""
MIN_NONZERO_BETA_US_PER_BYTE = 1e-100
"""The same floor for a nonzero per-byte cost."""
MAX_WORKERS = 2**20
"""A million workers: beyond the largest clusters built."""

MIN_COMPUTE_SPEEDUP = 1e-3
MAX_COMPUTE_SPEEDUP = 1e6
"""``--compute-speedup`` and a schedule's ``meta.compute_speedup``: from 1000x slower to a million
times faster than profiled (CPU profiles are replayed 10x to 100x faster in the docs)."""
