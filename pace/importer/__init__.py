"""Import the traces users already collect: torch.profiler (Kineto) + Execution Trace -> Trace.

Entry points: ``import_trace(kineto, execution_trace=...) -> ImportResult`` (``pace import``);
``record(model, step_fn, ...)``, which writes both files the documented way;
``save_parameters(model, path)``, the ``named_parameters()`` file for traces without names;
``compare_traces(reference, other)``, how far two traces of one model agree. The importer fills
``pace profile``'s own per-iteration records and builds the window with
``pace.profiler.window``, so the trace means what a ``pace profile`` trace means. See
docs/import.md.

Reading the files needs no torch; building the window imports it (the profiler's record
types), and ``record``/``save_parameters`` need it too."""

from __future__ import annotations

from pace.importer.agree import Agreement, compare_traces
from pace.importer.api import TIMINGS, ImportResult, import_trace
from pace.importer.comm import CommSamples
from pace.importer.params import ParamSpec, load_parameters
from pace.importer.recorder import Recorded, record, save_parameters

__all__ = [
    "TIMINGS",
    "Agreement",
    "CommSamples",
    "ImportResult",
    "ParamSpec",
    "Recorded",
    "compare_traces",
    "import_trace",
    "load_parameters",
    "record",
    "save_parameters",
]
