"""Numbers as people read them: a rate with a unit prefix that fits (``576``, ``2.38 k``, ``1.23 M``)."""

from __future__ import annotations

import math

__all__ = ["si_number"]

_PREFIXES = ("", " k", " M", " G", " T")


def si_number(value: float) -> str:
    """``value`` to 3 significant digits with the SI prefix that keeps it below 1000.

    ``576.3`` -> ``"576"``, ``2375.2`` -> ``"2.38 k"``, ``999_700`` -> ``"1 M"``, ``1.234e6`` ->
    ``"1.23 M"``; not finite -> ``"–"``. One formatter for every place that shows rays/s and samples/s
    (the progress bar, the viewer's training panel), so that a CPU's few hundred rays/s never reads
    ``0.00 M``.
    """
    if not math.isfinite(value):
        return "–"
    v = float(f"{value:.3g}")  # round first: 999.7 becomes 1000, shown as 1 k rather than 1000
    i = 0
    while abs(v) >= 1000 and i < len(_PREFIXES) - 1:
        v /= 1000
        i += 1
    return f"{v:.3g}{_PREFIXES[i]}"
