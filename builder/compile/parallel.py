"""Run compile jobs: a local process pool, or a Ray cluster.

Workers are GPU-blind and import the DSL once (``prepare_worker``). A job
that fails comes back as a :class:`~builder.compile.job.CompileFailure` value, so
one bad kernel never stops the others. The local pool sizes itself to the
cores and to memory: one DSL compile peaks at about 250 MB resident
(measured 233-256 MB for Hopper and Blackwell GEMMs), so a worker is budgeted
300 MB of ``MemAvailable``.

The local pool also bounds each job (:class:`Limits`): the build process
watches every running job's wall time and its worker's resident memory and
kills a worker past either (COMPILE-TIMEOUT, COMPILE-MEMORY). Workers die
with the build process (``PR_SET_PDEATHSIG``), so a build killed with
SIGKILL leaves no worker behind, and keep their temporary files in the
scratch directory the build gives the executor, which the next build sweeps.

This module never imports the DSL or Ray itself; workers do.
"""

from __future__ import annotations

import contextlib
import ctypes
import importlib.util
import logging
import multiprocessing
import os
import signal
import sys
import tempfile
import time
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator, Protocol

from builder.compile.job import (
    COMPILE_CRASHED,
    COMPILE_MEMORY,
    COMPILE_NO_WORKERS,
    COMPILE_TIMEOUT,
    CompileFailure,
    CompileJob,
    CompileOutput,
    compile_job,
    prepare_worker,
)
from builder.compile.limits import JOB_LIMITS, Limits
from builder.diagnostics import did_you_mean

WORKER_MEMORY_BYTES = 300 * 2**20
# How often the build process looks at its running jobs: a job is killed at
# most this long after passing a limit.
WATCH_SECONDS = 0.2
PR_SET_PDEATHSIG = 1  # <linux/prctl.h>
# A worker's resident size grows by about 2.3 MB per compile (292 to 386 MB over
# 40 sm90a kernels in one process), so workers are replaced after this many jobs
# (one more DSL import, about 1 s, per 64 compiles) to keep far below --job-memory.
JOBS_PER_WORKER = 64

Result = CompileOutput | CompileFailure


class ExecutorError(RuntimeError):
    """The executor itself cannot run (no Ray, cluster unreachable); not a kernel's fault."""


class Executor(Protocol):
    name: str

    def run(self, jobs: list[CompileJob], scratch: Path | None = None) -> Iterator[Result]:
        """Yield one result per job, in completion order. ``scratch``: a directory of this machine
        for the executor's temporary files, which the build removes (or the next build, if this
        one is killed); None: the system's temporary directory."""


def available_memory() -> int | None:
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def default_jobs() -> int:
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    memory = available_memory()
    by_memory = max(1, memory // WORKER_MEMORY_BYTES) if memory else cores
    return max(1, min(cores, by_memory))


@dataclass
class _Broken:
    """Jobs a pool did not finish because one of its workers died."""

    started: list[CompileJob] = field(default_factory=list)
    waiting: list[CompileJob] = field(default_factory=list)
    reason: str = ""


@dataclass
class LocalExecutor:
    """Compiles in ``jobs`` spawned worker processes on this machine, each job within ``limits``.

    Even one job runs in a worker process: a compile that kills its process
    (a crash inside MLIR, the OOM killer) must not take the build down. A dead
    worker breaks the pool for every job in it, so each job marks when it
    starts; a job the watchdog killed fails with its limit's id, the other
    jobs that had started are rerun one per fresh pool, which names the one
    that kills its worker, and the jobs that had not started go back to a
    new shared pool.
    """

    jobs: int
    limits: Limits = JOB_LIMITS
    name: str = "local"

    def run(self, jobs: list[CompileJob], scratch: Path | None = None) -> Iterator[Result]:
        with contextlib.ExitStack() as stack:
            if scratch is None:
                scratch = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="tilekiln-pool-")))
            yield from self._run(jobs, scratch)

    def _run(self, jobs: list[CompileJob], scratch: Path) -> Iterator[Result]:
        # CPython 3.11's ProcessPoolExecutor does not replace a worker that retires at
        # max_tasks_per_child while every job is already queued: once each worker has run
        # JOBS_PER_WORKER jobs the pool waits forever. So no pool gets more jobs than its
        # workers run before they retire; the next batch gets a fresh pool.
        batch = self.jobs * JOBS_PER_WORKER
        for start in range(0, len(jobs), batch):
            yield from self._run_batch(jobs[start:start + batch], scratch)

    def _run_batch(self, jobs: list[CompileJob], scratch: Path) -> Iterator[Result]:
        waiting = list(jobs)
        while waiting:
            broken = _Broken()
            finished = 0
            for result in _pool_run(waiting, self.jobs, broken, self.limits, scratch):
                finished += 1
                yield result
            if broken.waiting and not broken.started and not finished:
                # Not one job started: the workers cannot even start (the DSL does not import).
                for job in broken.waiting:
                    yield CompileFailure(job.kernel_id, job.arch,
                                         f"the compile workers cannot start ({broken.reason}); "
                                         "check that `import cutlass.cute` works in this environment", 0.0,
                                         COMPILE_NO_WORKERS)
                return
            waiting = broken.waiting
            for job in broken.started:
                alone = _Broken()
                results = list(_pool_run([job], 1, alone, self.limits, scratch))
                if alone.started or alone.waiting:
                    yield CompileFailure(job.kernel_id, job.arch,
                                         f"the compile worker died while compiling this kernel ({alone.reason}); "
                                         "it crashed or was killed (out of memory?)", 0.0, COMPILE_CRASHED)
                else:
                    yield from results


def _pool_run(jobs: list[CompileJob], workers: int, broken: _Broken, limits: Limits,
              scratch: Path) -> Iterator[Result]:
    context = multiprocessing.get_context("spawn")
    killed: dict[int, CompileFailure] = {}
    with tempfile.TemporaryDirectory(prefix="marks-", dir=scratch) as marks_dir, ProcessPoolExecutor(
            max_workers=max(1, min(workers, len(jobs))), mp_context=context, max_tasks_per_child=JOBS_PER_WORKER,
            initializer=_start_worker, initargs=(os.getpid(), str(scratch))) as pool:
        marks = Path(marks_dir)
        pending = {pool.submit(_marked_compile, job, str(marks / str(i))): (i, job)
                   for i, job in enumerate(jobs)}
        while pending:
            done, _ = wait(pending, timeout=WATCH_SECONDS, return_when=FIRST_COMPLETED)
            for future in done:
                i, job = pending.pop(future)
                try:
                    yield future.result()
                except BrokenProcessPool as exc:
                    if i in killed:
                        yield killed[i]
                        continue
                    broken.reason = str(exc) or type(exc).__name__
                    (broken.started if (marks / str(i)).exists() else broken.waiting).append(job)
            _watch(pending, marks, limits, killed)


def _watch(pending: dict[Future, tuple[int, CompileJob]], marks: Path, limits: Limits,
           killed: dict[int, CompileFailure]) -> None:
    """Kill the worker of every running job past a limit, and remember why in ``killed``."""
    now = time.monotonic()
    for future, (i, job) in pending.items():
        if i in killed or future.done():
            continue
        try:
            pid, start = (float(x) for x in (marks / str(i)).read_text().split())
        except (OSError, ValueError):
            continue  # not started, or its mark is being written
        elapsed = now - start
        resident = _resident_bytes(int(pid))
        if elapsed > limits.seconds:
            failure = CompileFailure(
                job.kernel_id, job.arch, f"the compile ran past the job time limit of {limits.seconds:g} s and was "
                f"killed after {elapsed:.1f} s", elapsed, COMPILE_TIMEOUT,
                {"limit_seconds": limits.seconds, "elapsed_seconds": round(elapsed, 1)})
        elif resident is not None and resident > limits.memory_bytes:
            failure = CompileFailure(
                job.kernel_id, job.arch, f"the compile's worker grew to {resident / 10**6:.0f} MB resident, past "
                f"the job memory limit of {limits.memory_bytes / 10**6:.0f} MB, and was killed after {elapsed:.1f} s",
                elapsed, COMPILE_MEMORY, {"limit_bytes": limits.memory_bytes, "resident_bytes": resident,
                                          "elapsed_seconds": round(elapsed, 1)})
        else:
            continue
        with contextlib.suppress(ProcessLookupError):
            os.kill(int(pid), signal.SIGKILL)
        killed[i] = failure


def _resident_bytes(pid: int) -> int | None:
    """The resident set of process ``pid`` (``VmRSS``), or None if it is gone."""
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def _start_worker(parent: int, scratch: str) -> None:
    """Pool initializer: die with the build process, keep temporary files in ``scratch``, import the DSL."""
    if sys.platform == "linux":
        # Without this a worker of a build killed with SIGKILL waits forever on the
        # dead pool's queue (issue 35 counted 42 such processes after 14 kills).
        if ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0) != 0:
            raise OSError(ctypes.get_errno(), "prctl(PR_SET_PDEATHSIG) failed")
        if os.getppid() != parent:
            os._exit(1)  # the build died before prctl took effect
    # The DSL, its compiler and the cubin inspector's tools write temporary files too.
    os.environ["TMPDIR"] = tempfile.tempdir = scratch
    prepare_worker()


def _marked_compile(job: CompileJob, mark: str) -> Result:
    Path(mark).write_text(f"{os.getpid()} {time.monotonic()}")
    return compile_job(job)


@dataclass
class RayExecutor:
    """Sends compile jobs to a Ray cluster (``pip install 'tilekiln-build[ray]'``).

    ``address`` None joins the Ray instance this process already started, or
    starts a local one (``RAY_ADDRESS`` is honoured by Ray); otherwise a
    cluster address such as ``ray://head:10001`` or ``auto``. Each job is one
    Ray task needing one CPU and a compile's memory; results travel back as
    the same values the local pool returns, and the build checks each one's
    toolchain fingerprint, so a node with other wheel versions cannot slip an
    object into the bundle. Every node needs ``tilekiln-build`` installed.
    """

    address: str | None
    name: str = "ray"

    def run(self, jobs: list[CompileJob], scratch: Path | None = None) -> Iterator[Result]:
        if not jobs:
            return
        import ray

        if not ray.is_initialized():
            try:
                ray.init(address=self.address, log_to_driver=False, include_dashboard=False,
                         logging_level=logging.WARNING)
            except (ConnectionError, ValueError, RuntimeError) as exc:
                where = self.address or "a new local instance"
                raise ExecutorError(f"cannot start or reach Ray ({where}): {exc}") from None
        # A node lost mid-task is worth a retry; a kernel that kills its worker
        # every time fails after one.
        task = ray.remote(num_cpus=1, memory=WORKER_MEMORY_BYTES, max_retries=1)(_ray_compile)
        refs = {task.remote(job): job for job in jobs}
        while refs:
            done, _ = ray.wait(list(refs), num_returns=1)
            for ref in done:
                job = refs.pop(ref)
                try:
                    yield ray.get(ref)
                except Exception as exc:  # noqa: BLE001 - a lost worker or node
                    yield CompileFailure(job.kernel_id, job.arch, f"ray task failed: {exc!r}", 0.0, COMPILE_CRASHED)


def _ray_compile(job: CompileJob) -> Result:
    prepare_worker()
    return compile_job(job)


def make_executor(spec: str, jobs: int, limits: Limits = JOB_LIMITS) -> Executor:
    """``local`` or ``ray`` or ``ray=ADDRESS``; ``limits`` bound each job of the local executor."""
    if spec == "local":
        return LocalExecutor(jobs, limits)
    if spec == "ray" or spec.startswith("ray="):
        if importlib.util.find_spec("ray") is None:
            raise ValueError("--executor ray needs Ray: pip install 'tilekiln-build[ray]'")
        return RayExecutor(spec.partition("=")[2] or None)
    close = did_you_mean(spec, ("local", "ray"))
    raise ValueError(f"unknown executor {spec!r}; " + (f"did you mean {close!r}? " if close else "")
                     + "use local, ray or ray=ADDRESS")
