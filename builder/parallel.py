"""Run compile jobs: a local process pool, or a Ray cluster.

Workers are GPU-blind and import the DSL once (``prepare_worker``). A job
that fails comes back as a :class:`~builder.compile.CompileFailure` value, so
one bad kernel never stops the others. The local pool sizes itself to the
cores and to memory: one DSL compile peaks at about 250 MB resident
(measured 233-256 MB for Hopper and Blackwell GEMMs), so a worker is budgeted
300 MB of ``MemAvailable``.
"""

from __future__ import annotations

import multiprocessing
import os
from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait
from dataclasses import dataclass
from typing import Iterator, Protocol

from builder.compile import CompileFailure, CompileJob, CompileOutput, compile_job, prepare_worker

WORKER_MEMORY_BYTES = 300 * 2**20

Result = CompileOutput | CompileFailure


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
class LocalExecutor:
    jobs: int
    name: str = "local"

    def run(self, jobs: list[CompileJob]) -> Iterator[Result]:
        if not jobs:
            return
        workers = max(1, min(self.jobs, len(jobs)))
        if workers == 1:
            for job in jobs:
                yield compile_job(job)
            return
        context = multiprocessing.get_context("spawn")
        with ProcessPoolExecutor(max_workers=workers, mp_context=context, initializer=prepare_worker) as pool:
            pending = {pool.submit(compile_job, job): job for job in jobs}
            while pending:
                done, _ = wait(pending, return_when=FIRST_COMPLETED)
                for future in done:
                    job = pending.pop(future)
                    try:
                        yield future.result()
                    except Exception as exc:  # a worker died (OOM kill, signal)
                        yield CompileFailure(job.kernel_id, job.arch, f"compile worker died: {exc!r}", 0.0)


@dataclass
class RayExecutor:
    """Sends compile jobs to a Ray cluster (``pip install 'tilekiln[ray]'``).

    ``address`` None starts or joins a local Ray instance; otherwise it is a
    cluster address such as ``ray://head:10001`` or ``auto``. Each job is one
    Ray task needing one CPU; results travel back as the same values the
    local pool returns, so the rest of the build cannot tell them apart.
    """

    address: str | None
    name: str = "ray"

    def run(self, jobs: list[CompileJob]) -> Iterator[Result]:
        try:
            import ray
        except ImportError:
            raise RuntimeError("the ray executor needs Ray: pip install 'tilekiln[ray]'") from None
        if not ray.is_initialized():
            ray.init(address=self.address, log_to_driver=False, include_dashboard=False)
        task = ray.remote(num_cpus=1)(_ray_compile)
        refs = {task.remote(job): job for job in jobs}
        while refs:
            done, _ = ray.wait(list(refs), num_returns=1)
            for ref in done:
                job = refs.pop(ref)
                try:
                    yield ray.get(ref)
                except Exception as exc:  # noqa: BLE001 - a lost worker or node
                    yield CompileFailure(job.kernel_id, job.arch, f"ray task failed: {exc!r}", 0.0)


def _ray_compile(job: CompileJob) -> Result:
    prepare_worker()
    return compile_job(job)


def make_executor(spec: str, jobs: int) -> Executor:
    """``local`` or ``ray`` or ``ray=ADDRESS``."""
    if spec == "local":
        return LocalExecutor(jobs)
    if spec == "ray" or spec.startswith("ray="):
        return RayExecutor(spec.partition("=")[2] or None)
    raise ValueError(f"unknown executor {spec!r}; use local, ray or ray=ADDRESS")
