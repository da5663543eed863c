"""The build: validated catalog -> rendered sources -> objects -> bundles.

``build(request)`` runs the stages for every selected target arch:

1. select kernels (``--pipeline``, ``--arch``, ``--only``, ``--shard``);
2. render each to its CuTe DSL source and look its object up in the
   content-addressed cache (key: source sha256, compile options, target
   arch, toolchain fingerprint, compile protocol);
3. compile the misses on the executor, keep going past failures;
4. inspect every cubin (registers, spills, shared memory, SASS census) and
   check the traced shared-memory size against the validator's model;
5. link the passing kernels into one library (cached by its inputs) and
   write the bundle atomically, with ``build-report.json``.

A failed kernel leaves the previous bundle in place unless
``allow_partial`` asks for a bundle of what passed.
"""

from __future__ import annotations

import fnmatch
import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path

from builder.bundle import BundleFile, bundle_name, library_name, write_bundle
from builder.cache import ContentCache, canonical_key
from builder.compile import CompileFailure, CompileJob, CompileOutput
from builder.cubin import CubinInfo, compiled_for, inspect_cubin
from builder.diagnostics import Diagnostic, DiagnosticError, Location, Severity
from builder.link import LinkInput, link_library, render_glue
from builder.manifest import make_manifest
from builder.objfile import EntryPoints, ObjectFormatError, cubins, entry_points, fatbin
from builder.parallel import Executor
from builder.progress import BuildProgress
from builder.render import render_kernel
from builder.rules import KernelContext
from builder.toolchain import toolchain
from builder.validate import Project, Validation, validate_project

# Bump when compile.py changes what it feeds the DSL or how it exports.
COMPILE_PROTOCOL = 1
REPORT_NAME = "build-report.json"


@dataclass(frozen=True)
class Selection:
    pipelines: tuple[str, ...] = ()
    arches: tuple[str, ...] = ()
    only: tuple[str, ...] = ()
    shard: tuple[int, int] | None = None  # (index from 1, count)

    def planned(self, validation: Validation) -> list[tuple[str, KernelContext]]:
        """(arch, kernel) pairs to build, in a deterministic order."""
        pairs = []
        for ctx in validation.kernels:
            if self.pipelines and ctx.entry.config.pipeline not in self.pipelines:
                continue
            if self.only and not any(fnmatch.fnmatchcase(ctx.entry.kernel_id, p) for p in self.only):
                continue
            for arch in ctx.entry.targets:
                if not self.arches or arch in self.arches:
                    pairs.append((arch, ctx))
        pairs.sort(key=lambda p: (p[0], p[1].entry.kernel_id))
        if self.shard is not None:
            index, count = self.shard
            pairs = [p for i, p in enumerate(pairs) if i % count == index - 1]
        return pairs


@dataclass(frozen=True)
class BuildRequest:
    root: Path
    out_dir: Path
    cache_dir: Path
    executor: Executor
    selection: Selection = Selection()
    allow_partial: bool = False
    progress: str = "auto"


@dataclass(frozen=True)
class KernelRecord:
    kernel_id: str
    arch: str
    status: str  # compiled | cached | failed
    seconds: float
    error: str = ""
    ctx: KernelContext | None = None
    source: str = ""
    object_bytes: bytes = b""
    cubin: bytes = b""
    info: CubinInfo | None = None
    entry: EntryPoints | None = None

    @property
    def ok(self) -> bool:
        return self.status != "failed"

    def report(self) -> dict:
        row = {"kernel": self.kernel_id, "arch": self.arch, "status": self.status,
               "compile_seconds": round(self.seconds, 3)}
        if self.info is not None:
            row.update(registers=self.info.registers, spills=self.info.spills,
                       local_bytes=self.info.local_bytes, stack_bytes=self.info.stack_bytes,
                       smem_bytes=self.ctx.plan.smem.total if self.ctx else None,
                       cubin_bytes=len(self.cubin), sass=dict(self.info.census))
        if self.error:
            row["error"] = "\n".join(self.error.strip().splitlines()[:12])
        return row


@dataclass(frozen=True)
class BundleResult:
    bundle: str
    arch: str
    records: tuple[KernelRecord, ...]
    path: Path | None
    report_path: Path

    @property
    def failed(self) -> tuple[KernelRecord, ...]:
        return tuple(r for r in self.records if not r.ok)


@dataclass(frozen=True)
class BuildResult:
    bundles: tuple[BundleResult, ...]
    diagnostics: tuple[Diagnostic, ...] = field(default_factory=tuple)

    @property
    def ok(self) -> bool:
        return all(not b.failed for b in self.bundles)


def build(request: BuildRequest) -> BuildResult:
    validation = validate_project(Project(request.root))
    errors = [d for d in validation.diagnostics if d.severity is Severity.ERROR]
    if errors:
        raise DiagnosticError(errors)
    planned = request.selection.planned(validation)
    if not planned:
        raise DiagnosticError([Diagnostic("BUILD-EMPTY", "the selection matches no kernel",
                                          Location("catalog"), "check --pipeline, --arch and --only")])
    cache = ContentCache(request.cache_dir)
    results = []
    for arch in sorted({a for a, _ in planned}):
        kernels = [ctx for a, ctx in planned if a == arch]
        records = compile_kernels(arch, kernels, cache, request)
        results.append(write_bundle_for(arch, records, validation, cache, request))
    return BuildResult(tuple(results), tuple(validation.diagnostics))


def object_key(job: CompileJob) -> str:
    tools = toolchain()
    return canonical_key({"kind": "kernel", "protocol": COMPILE_PROTOCOL, "arch": job.arch,
                          "options": job.options, "source_sha256": hashlib.sha256(job.source.encode()).hexdigest(),
                          "toolchain": tools.fingerprint})


def compile_kernels(arch: str, kernels: list[KernelContext], cache: ContentCache,
                    request: BuildRequest) -> list[KernelRecord]:
    jobs = {ctx.entry.kernel_id: (ctx, CompileJob(ctx.entry.kernel_id, arch, render_kernel(ctx).text))
            for ctx in kernels}
    records: dict[str, KernelRecord] = {}
    misses = []
    with BuildProgress(request.progress, len(jobs), f"building {bundle_name(arch)}") as progress:
        for kid, (ctx, job) in jobs.items():
            hit = cache.get("kernel", object_key(job))
            if hit is None:
                misses.append(job)
                continue
            records[kid] = _record_from_cache(ctx, job, hit)
            progress.advance(kid, "cached", 0.0)
        for result in request.executor.run(misses):
            ctx, job = jobs[result.kernel_id]
            record = _record_from_result(ctx, job, result, cache)
            records[result.kernel_id] = record
            progress.advance(record.kernel_id, record.status, record.seconds)
    return [records[kid] for kid in sorted(records)]


def _record_from_cache(ctx: KernelContext, job: CompileJob, hit) -> KernelRecord:
    meta = hit.meta
    info = CubinInfo(meta["cubin"]["arch"], meta["cubin"]["registers"], meta["cubin"]["stack_bytes"],
                     meta["cubin"]["static_smem_bytes"], meta["cubin"]["local_bytes"],
                     tuple((k, v) for k, v in meta["cubin"]["census"]))
    return KernelRecord(job.kernel_id, job.arch, "cached", meta["seconds"], ctx=ctx, source=job.source,
                        object_bytes=hit.read("kernel.o"), cubin=hit.read("kernel.cubin"), info=info,
                        entry=EntryPoints(**meta["entry"]))


def _record_from_result(ctx: KernelContext, job: CompileJob, result: CompileOutput | CompileFailure,
                        cache: ContentCache) -> KernelRecord:
    if isinstance(result, CompileFailure):
        return KernelRecord(job.kernel_id, job.arch, "failed", result.seconds, error=result.message, ctx=ctx,
                            source=job.source)
    try:
        entry = entry_points(result.object_bytes, result.prefix)
        cubin = cubins(fatbin(result.object_bytes))[0]
        info = inspect_cubin(cubin)
        target = compiled_for(cubin)
    except (ObjectFormatError, RuntimeError) as exc:
        return KernelRecord(job.kernel_id, job.arch, "failed", result.seconds, error=str(exc), ctx=ctx)
    if target != job.arch:
        return KernelRecord(job.kernel_id, job.arch, "failed", result.seconds, ctx=ctx, error=(
            f"CUBIN-ARCH: the cubin was assembled for {target}, not the requested target {job.arch}"))
    expected = ctx.plan.smem.dynamic_bytes
    if result.traced_smem_bytes != expected or info.static_smem_bytes != ctx.plan.smem.static_bytes:
        return KernelRecord(job.kernel_id, job.arch, "failed", result.seconds, ctx=ctx, error=(
            f"SMEM-MODEL: the kernel uses {result.traced_smem_bytes} B dynamic + {info.static_smem_bytes} B "
            f"static shared memory but the validator's model says {expected} + {ctx.plan.smem.static_bytes}; "
            "fix builder/derive.py or the template so they agree"))
    meta = {"seconds": result.seconds, "entry": entry.__dict__, "traced_smem_bytes": result.traced_smem_bytes,
            "cubin": {"arch": info.arch, "registers": info.registers, "stack_bytes": info.stack_bytes,
                      "static_smem_bytes": info.static_smem_bytes, "local_bytes": info.local_bytes,
                      "census": [list(c) for c in info.census]}}
    cache.put("kernel", object_key(job), {"kernel.o": result.object_bytes, "kernel.cubin": cubin}, meta)
    return KernelRecord(job.kernel_id, job.arch, "compiled", result.seconds, ctx=ctx, source=job.source,
                        object_bytes=result.object_bytes, cubin=cubin, info=info, entry=entry)


def write_bundle_for(arch: str, records: list[KernelRecord], validation: Validation, cache: ContentCache,
                     request: BuildRequest) -> BundleResult:
    bundle = bundle_name(arch)
    passed = [r for r in records if r.ok]
    failed = [r for r in records if not r.ok]
    report = {"bundle": bundle, "arch": arch, "kernels": [r.report() for r in records],
              "passed": len(passed), "failed": len(failed)}
    report_bytes = (json.dumps(report, indent=2) + "\n").encode()
    if (failed and not request.allow_partial) or not passed:
        report_path = request.out_dir / f"{bundle}.{REPORT_NAME}"
        request.out_dir.mkdir(parents=True, exist_ok=True)
        report_path.write_bytes(report_bytes)
        return BundleResult(bundle, arch, tuple(records), None, report_path)
    library = link_cached(bundle, passed, cache)
    files = [BundleFile(f"lib/{library_name(bundle)}", library)]
    for r in passed:
        files.append(BundleFile(f"cubins/{r.kernel_id}.cubin", r.cubin))
        files.append(BundleFile(f"sources/{r.kernel_id}.py", r.source.encode()))
    manifest = make_manifest(arch, passed, validation, request.root)
    path = write_bundle(request.out_dir, bundle, files, manifest,
                        extra={REPORT_NAME: report_bytes})
    return BundleResult(bundle, arch, tuple(records), path, path / REPORT_NAME)


def link_cached(bundle: str, records: list[KernelRecord], cache: ContentCache) -> bytes:
    inputs = [LinkInput(r.kernel_id, r.object_bytes, r.entry) for r in records]
    key = canonical_key({"kind": "library", "glue": render_glue(bundle, inputs),
                         "objects": [hashlib.sha256(r.object_bytes).hexdigest() for r in records],
                         "toolchain": toolchain().fingerprint, "bundle": bundle})
    hit = cache.get("library", key)
    if hit is not None:
        return hit.read("lib.so")
    out = cache.root / "tmp" / f"link-{key}.so"
    out.parent.mkdir(parents=True, exist_ok=True)
    try:
        link_library(bundle, inputs, out)
        data = out.read_bytes()
    finally:
        out.unlink(missing_ok=True)
    cache.put("library", key, {"lib.so": data}, {"bundle": bundle})
    return data
