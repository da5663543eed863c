"""Compile one rendered kernel source with the CuTe DSL, on the CPU.

Runs in a GPU-blind worker process: the source is written to a private
directory as module ``tilekiln_kernel`` (the DSL embeds the module and class
name in symbol names, so a fixed name keeps the output byte-reproducible),
imported, traced and compiled with an explicit ``--gpu-arch`` and the
generic x86-64 host target (without it ``export_to_c`` fails deviceless, and
the native default would emit host code tuned to the build CPU), then
exported with ``export_to_c`` under a content-derived symbol prefix.

The worker also takes the cubin out of the object and inspects it
(``builder.compile.cubin``: registers, shared memory, SASS census). The disassembly
behind the census costs about 0.3 s of CPU per kernel; done serially in the
build process it would cap any build near 150 kernels/min whatever the
number of workers, here it scales with them (bench/results/build-2026-12-02.json:
65 kernels/min with one worker, 116 with two).

Measured on a 2-core build machine: 0.8 s to import the DSL once per worker,
then 1-2 s per Hopper GEMM to trace, compile and export.
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import re
import sys
import tempfile
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Mapping

from builder.compile.cubin import CubinInfo, inspect_cubin
from builder.compile.objfile import EntryPoints, cubins, entry_points, fatbin
from builder.compile.toolchain import HOST_TARGET, compiler_fingerprint, inspector_fingerprint

MODULE_NAME = "tilekiln_kernel"
# The DSL reads CUTE_DSL_* settings (line info, optimisation level, dumps,
# default arch) from the environment. A build must not depend on the shell it
# runs in, so workers drop every such variable and set only these; they are
# part of each object's cache key.
COMPILE_ENV = (
    # The DSL's own cache would only shadow ours; its key does not cover our inputs.
    ("CUTE_DSL_DISABLE_FILE_CACHING", "1"),
)
_DSL_ENV_PREFIX = "CUTE_DSL_"
_ANSI = re.compile(r"\x1b\[[0-9;]*m")

# Stable ids of the ways a kernel fails after validation, each with its hint
# (docs/catalog.md, "Diagnostics from the build"). The worker and the pool
# know the first five; the build process checks each fresh object for the
# others (builder/pipeline/build.py), where the kernel's catalog entry is at hand.
COMPILE_FAILED = "COMPILE-FAILED"
COMPILE_CRASHED = "COMPILE-CRASHED"
COMPILE_NO_WORKERS = "COMPILE-NO-WORKERS"
COMPILE_TIMEOUT = "COMPILE-TIMEOUT"
COMPILE_MEMORY = "COMPILE-MEMORY"
COMPILE_ARCH_DRIFT = "COMPILE-ARCH-DRIFT"
COMPILE_SMEM_DRIFT = "COMPILE-SMEM-DRIFT"
TOOLCHAIN_MISMATCH = "TOOLCHAIN-MISMATCH"
COMPILE_HINTS = {
    COMPILE_FAILED: "the rendered template or the DSL raised; fix the template, or add a rule that rejects "
                    "this config before it is compiled",
    COMPILE_CRASHED: "the compile worker crashed or was killed (out of memory?); rerun with fewer jobs (-j) to "
                     "tell memory pressure from a crash inside the compiler",
    COMPILE_NO_WORKERS: "check that `import cutlass.cute` works in this environment",
    COMPILE_TIMEOUT: "the compile hung or is far slower than every other kernel; raise --job-timeout if it only "
                     "needs longer, otherwise remove the config from the catalog and report it against the DSL",
    COMPILE_MEMORY: "the compile needs far more memory than every other kernel; raise --job-memory if the machine "
                    "has it, otherwise remove the config from the catalog and report it against the DSL",
    COMPILE_ARCH_DRIFT: "the DSL compiled for another target than --gpu-arch asked for; check the target's name "
                        "in catalog/hardware/ against the DSL's arch list",
    COMPILE_SMEM_DRIFT: "fix builder/derive or the template so that the validator's model and the kernel agree",
    TOOLCHAIN_MISMATCH: "install the same tilekiln-build wheels (and Python minor version) on every executor node",
}


@dataclass(frozen=True)
class CompileJob:
    kernel_id: str
    arch: str
    source: str

    @property
    def options(self) -> str:
        return f"--gpu-arch {self.arch} --host-target '{HOST_TARGET}'"

    @property
    def prefix(self) -> str:
        """Symbol prefix; derived from content so a cached object fits any bundle."""
        digest = hashlib.sha256(f"{self.arch}\n{self.options}\n{self.source}".encode()).hexdigest()
        return f"tk_{digest[:20]}"


@dataclass(frozen=True)
class CompileOutput:
    kernel_id: str
    arch: str
    prefix: str
    object_bytes: bytes
    traced_smem_bytes: int
    seconds: float
    cubin: bytes
    info: CubinInfo
    entry: EntryPoints
    # (compiler_fingerprint(), inspector_fingerprint()) of the worker that made it
    toolchain: tuple[str, str]


@dataclass(frozen=True)
class CompileFailure:
    """A compile that produced no object; ``rule`` says how it failed (:data:`COMPILE_HINTS`),
    ``facts`` what decided it. Plain values only: it travels back from worker processes and Ray."""

    kernel_id: str
    arch: str
    message: str
    seconds: float
    rule: str = COMPILE_FAILED
    facts: Mapping[str, object] = field(default_factory=dict)


def prepare_worker() -> None:
    """Process-pool initializer: the environment the DSL reads at import, then the import."""
    if "cutlass" not in sys.modules:
        for name in [n for n in os.environ if n.startswith(_DSL_ENV_PREFIX)]:
            del os.environ[name]
        os.environ.update(COMPILE_ENV)
        # No GPU is used or wanted while compiling.
        os.environ.setdefault("CUDA_VISIBLE_DEVICES", "")
    import cutlass.cute  # noqa: F401  (pay the ~1 s import once per worker)


def compile_job(job: CompileJob) -> CompileOutput | CompileFailure:
    """Compile ``job``; any failure comes back as a value, never an exception."""
    start = time.perf_counter()
    try:
        with tempfile.TemporaryDirectory(prefix="tilekiln-compile-") as tmp:
            object_bytes, traced_smem = _compile(job, Path(tmp))
        entry = entry_points(object_bytes, job.prefix)
        cubin = cubins(fatbin(object_bytes))[0]
        info = inspect_cubin(cubin)
        return CompileOutput(job.kernel_id, job.arch, job.prefix, object_bytes, traced_smem,
                             time.perf_counter() - start, cubin, info, entry,
                             (compiler_fingerprint(), inspector_fingerprint()))
    except BaseException as exc:  # noqa: BLE001 - the DSL raises many types; all are reported
        if isinstance(exc, KeyboardInterrupt):
            raise
        return CompileFailure(job.kernel_id, job.arch, _describe(exc), time.perf_counter() - start,
                              COMPILE_FAILED, {"exception": type(exc).__name__})
    finally:
        sys.modules.pop(MODULE_NAME, None)


def _compile(job: CompileJob, workdir: Path) -> tuple[bytes, int]:
    prepare_worker()
    import cutlass.cute as cute

    source_path = workdir / f"{MODULE_NAME}.py"
    source_path.write_text(job.source)
    spec = importlib.util.spec_from_file_location(MODULE_NAME, source_path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[MODULE_NAME] = module
    spec.loader.exec_module(module)
    compiled = cute.compile(module.ENTRY, *module.fake_arguments(), options=job.options)
    compiled.export_to_c(file_path=str(workdir), file_name="kernel", function_prefix=job.prefix)
    return (workdir / "kernel.o").read_bytes(), int(module.TRACE.get("smem_bytes", -1))


def _describe(exc: BaseException) -> str:
    text = _ANSI.sub("", "".join(traceback.format_exception_only(type(exc), exc))).strip()
    if not text or text == type(exc).__name__:
        text = _ANSI.sub("", traceback.format_exc())
    return text
