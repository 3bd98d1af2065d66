"""Plain-loop references of every op, written to follow the papers' descriptions step by step.

Tests compare the kernels against these; benchmarks time the kernels against the
approach the papers' own code takes. Deliberately slow and obvious: no vectorisation
beyond what the papers' code used.
"""

from __future__ import annotations

# ---- distances and rank correlation (J&W 2019) -------------------------------------------

# ---- removal and flip search (S&S 2019) ----------------------------------------------------
