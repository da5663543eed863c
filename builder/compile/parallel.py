"""Run compile jobs: a local process pool, or a Ray cluster.

Workers are GPU-blind and import the DSL once (``prepare_worker``). A job
that fails comes back as a :class:`~builder.compile.job.CompileFailure` value, so
one bad kernel never stops the others. The local pool sizes itself to the
cores and to memory: one DSL compile peaks at about 250 MB resident
(measured 233-256 MB for Hopper and Blackwell GEMMs), so a worker is budgeted
300 MB of ``MemAvailable``.

This module never imports the DSL or Ray itself; workers do.
"""

from __future__ import annotations

import importlib.util
import logging
import multiprocessing
import os
import tempfile
from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator, Protocol

from builder.compile.job import (
    COMPILE_CRASHED,
    COMPILE_NO_WORKERS,
    CompileFailure,
    CompileJob,
    CompileOutput,
    compile_job,
    prepare_worker,
)
from builder.diagnostics import did_you_mean

WORKER_MEMORY_BYTES = 300 * 2**20

Result = CompileOutput | CompileFailure


class ExecutorError(RuntimeError):
    """The executor itself cannot run (no Ray, cluster unreachable); not a kernel's fault."""


class Executor(Protocol):
    name: str

    def run(self, jobs: list[CompileJob]) -> Iterator[Result]:
        """Yield one result per job, in completion order."""


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
    """Compiles in ``jobs`` spawned worker processes on this machine.

    Even one job runs in a worker process: a compile that kills its process
    (a crash inside MLIR, the OOM killer) must not take the build down. A dead
    worker breaks the pool for every job in it, so each job marks when it
    starts; the jobs that had started are then rerun one per fresh pool, which
    names the one that kills its worker, and the jobs that had not started go
    back to a new shared pool.
    """

    jobs: int
    name: str = "local"

    def run(self, jobs: list[CompileJob]) -> Iterator[Result]:
        waiting = list(jobs)
        while waiting:
            broken = _Broken()
            finished = 0
            for result in _pool_run(waiting, self.jobs, broken):
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
                results = list(_pool_run([job], 1, alone))
                if alone.started or alone.waiting:
                    yield CompileFailure(job.kernel_id, job.arch,
                                         f"the compile worker died while compiling this kernel ({alone.reason}); "
                                         "it crashed or was killed (out of memory?)", 0.0, COMPILE_CRASHED)
                else:
                    yield from results


def _pool_run(jobs: list[CompileJob], workers: int, broken: _Broken) -> Iterator[Result]:
    context = multiprocessing.get_context("spawn")
    with tempfile.TemporaryDirectory(prefix="tilekiln-pool-") as marks, \
            ProcessPoolExecutor(max_workers=max(1, min(workers, len(jobs))), mp_context=context,
                                initializer=prepare_worker) as pool:
        pending = {pool.submit(_marked_compile, job, str(Path(marks) / str(i))): (i, job)
                   for i, job in enumerate(jobs)}
        while pending:
            done, _ = wait(pending, return_when=FIRST_COMPLETED)
            for future in done:
                i, job = pending.pop(future)
                try:
                    yield future.result()
                except BrokenProcessPool as exc:
                    broken.reason = str(exc) or type(exc).__name__
                    (broken.started if (Path(marks) / str(i)).exists() else broken.waiting).append(job)


def _marked_compile(job: CompileJob, mark: str) -> Result:
    Path(mark).touch()
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

    def run(self, jobs: list[CompileJob]) -> Iterator[Result]:
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


def make_executor(spec: str, jobs: int) -> Executor:
    """``local`` or ``ray`` or ``ray=ADDRESS``."""
    if spec == "local":
        return LocalExecutor(jobs)
    if spec == "ray" or spec.startswith("ray="):
        if importlib.util.find_spec("ray") is None:
            raise ValueError("--executor ray needs Ray: pip install 'tilekiln-build[ray]'")
        return RayExecutor(spec.partition("=")[2] or None)
    close = did_you_mean(spec, ("local", "ray"))
    raise ValueError(f"unknown executor {spec!r}; " + (f"did you mean {close!r}? " if close else "")
                     + "use local, ray or ray=ADDRESS")
