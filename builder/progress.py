"""Build progress: a rich bar on a terminal, one plain line per kernel in CI logs."""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass, field

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn


@dataclass
class BuildProgress:
    """``mode``: ``auto`` (bar on a tty, plain otherwise), ``rich``, ``plain`` or ``none``."""

    mode: str
    total: int
    label: str
    done: int = 0
    failed: int = 0
    cached: int = 0
    _start: float = field(default_factory=time.perf_counter)
    _bar: Progress | None = None
    _task: int | None = None

    def __enter__(self) -> "BuildProgress":
        if self.mode == "auto":
            self.mode = "rich" if sys.stderr.isatty() else "plain"
        if self.mode == "rich" and self.total:
            self._bar = Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                                 TextColumn("failed {task.fields[failed]}"), TimeElapsedColumn(),
                                 TextColumn("eta"), TimeRemainingColumn(), console=Console(stderr=True))
            self._bar.start()
            self._task = self._bar.add_task(self.label, total=self.total, failed=0)
        return self

    def __exit__(self, *exc) -> None:
        if self._bar is not None:
            self._bar.stop()

    def advance(self, kernel_id: str, status: str, seconds: float) -> None:
        self.done += 1
        self.failed += status == "failed"
        self.cached += status == "cached"
        if self._bar is not None:
            self._bar.update(self._task, advance=1, failed=self.failed)
        elif self.mode == "plain":
            elapsed = time.perf_counter() - self._start
            eta = elapsed / self.done * (self.total - self.done) if self.done else 0.0
            print(f"[{self.done}/{self.total}] {status:8s} {kernel_id} ({seconds:.1f}s; "
                  f"failed {self.failed}; eta {eta:.0f}s)", file=sys.stderr, flush=True)
