"""Build progress: a rich bar on a terminal, one plain line per compiled kernel in CI logs.

Cache hits are counted before compiling starts, so they are one line (plain)
or the bar's starting point (rich) and never skew the ETA, which comes from
the compiles alone.
"""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass, field

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn


@dataclass
class BuildProgress:
    """``mode``: ``auto`` (bar on a tty, plain otherwise), ``rich``, ``plain`` or ``none``.

    ``total`` kernels, of which ``cached`` are already done.
    """

    mode: str
    total: int
    label: str
    cached: int = 0
    done: int = 0
    failed: int = 0
    _start: float = field(default_factory=time.perf_counter)
    _bar: Progress | None = None
    _task: int | None = None

    def __enter__(self) -> "BuildProgress":
        if self.mode == "auto":
            self.mode = "rich" if sys.stderr.isatty() else "plain"
        self.done = self.cached
        if self.mode == "rich" and self.total > self.cached:
            self._bar = Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                                 TextColumn("{task.fields[failed]}"), TimeElapsedColumn(),
                                 TextColumn("eta"), TimeRemainingColumn(), console=Console(stderr=True))
            self._bar.start()
            self._task = self._bar.add_task(self.label, total=self.total, completed=self.cached,
                                            failed=self._failed_text())
        elif self.mode == "plain":
            print(f"{self.label}: {self.total} kernels, {self.cached} cached, {self.total - self.cached} to compile",
                  file=sys.stderr, flush=True)
        return self

    def __exit__(self, *exc) -> None:
        if self._bar is not None:
            self._bar.stop()

    def _failed_text(self) -> str:
        return f"[red]failed {self.failed}[/red]" if self.failed else "failed 0"

    def advance(self, kernel_id: str, status: str, seconds: float, target: str = "") -> None:
        """One kernel done; ``target`` (e.g. ``sm100a``) leads its plain line, since one
        kernel id is compiled for several targets of its pipeline."""
        self.done += 1
        self.failed += status == "failed"
        if self._bar is not None:
            self._bar.update(self._task, advance=1, failed=self._failed_text())
        elif self.mode == "plain":
            compiled = self.done - self.cached
            elapsed = time.perf_counter() - self._start
            eta = elapsed / compiled * (self.total - self.done)
            where = f"{target} " if target else ""
            print(f"[{self.done}/{self.total}] {where}{status:8s} {kernel_id} ({seconds:.1f}s; "
                  f"failed {self.failed}; eta {eta:.0f}s)", file=sys.stderr, flush=True)
