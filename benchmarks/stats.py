"""The one percentile every benchmark reports (p50, p95, p99)."""

from __future__ import annotations

import math
from collections.abc import Iterable


def percentile(values: Iterable[float], pct: float) -> float:
    """The ``pct``-th percentile of ``values``, ``pct`` in 0..100.

    Linear interpolation between the two closest ranks of the sorted values: rank
    ``pct / 100 * (n - 1)`` counted from 0. This is NumPy's default (``"linear"``),
    ``statistics.quantiles(method="inclusive")`` and Excel's ``PERCENTILE.INC``; its
    p50 is ``statistics.median``. Empty input gives ``nan``.
    """
    if not 0 <= pct <= 100:
        msg = f"pct must be within 0..100, got {pct}"
        raise ValueError(msg)
    ordered = sorted(values)
    if not ordered:
        return math.nan
    rank = pct / 100 * (len(ordered) - 1)
    low = math.floor(rank)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)
