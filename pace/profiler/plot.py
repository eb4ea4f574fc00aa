"""Plot a measured all-reduce curve and its fit (for docs/img/comm_*.png)."""

from __future__ import annotations

import io
from pathlib import Path

from pace.io import write_atomic
from pace.profiler.comm import CommFit


def plot_comm(fit: CommFit, path: str | Path) -> None:
    """Log-log plot of the measured samples and the fitted ``alpha + beta * bytes``."""
    import matplotlib

    matplotlib.use("Agg")  # files only: no display on CI machines
    import matplotlib.pyplot as plt
    import numpy as np

    m = fit.model
    xs = np.array([b for b, _ in m.samples], dtype=float)
    ys = np.array([u for _, u in m.samples], dtype=float)
    grid = np.geomspace(xs.min(), xs.max(), 200)
    fig, ax = plt.subplots(figsize=(6, 4))
    ax.loglog(xs, ys, "o", label="measured (median of slowest rank)")
    ax.loglog(
        grid,
        m.alpha_us + m.beta_us_per_byte * grid,
        "-",
        label=(
            f"fit: {m.alpha_us:.0f} us + {m.beta_us_per_byte * 1e3:.3f} us/KB  (R²={fit.r2:.3f})"
        ),
    )
    ax.set_xlabel("all-reduce size (bytes)")
    ax.set_ylabel("time (us)")
    ax.set_title(f"{fit.backend or 'all-reduce'}: {m.workers} processes on one machine")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend()
    fig.tight_layout()
    png = io.BytesIO()
    fig.savefig(png, dpi=110, format="png")
    plt.close(fig)
    write_atomic(path, png.getvalue())
