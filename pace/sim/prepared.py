"""Transitional alias (removed once every caller uses pace.analysis)."""

from pace.analysis import TraceAnalysis as Prepared
from pace.analysis import analyze as prepare

__all__ = ["Prepared", "prepare"]
