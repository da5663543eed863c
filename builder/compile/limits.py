"""The limits of one compile job: wall time and resident memory.

A leaf: the command line reads the defaults without importing the compile
machinery (builder/compile/parallel.py enforces them).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Limits:
    """What one compile job may take before the local pool kills its worker.

    The defaults are 20x and 10x what the catalog needs: in `make build-kernels`
    on the shared 2-core build machine (2026-12-07, 134 compiles at -j 2) the
    slowest compile took 13.5 s (build-report.json), and a worker peaked at
    411 MB resident (VmHWM) compiling the largest Hopper and Blackwell kernels.
    """

    seconds: float = 300.0
    memory_bytes: int = 4 * 10**9


JOB_LIMITS = Limits()
