"""The build: validated catalog -> rendered sources -> objects -> bundles (or shards).

``build(request)`` runs the stages for every selected target arch:

1. select kernels (``--pipeline``, ``--arch``, ``--only``, ``--shard``);
2. render each to its CuTe DSL source and look its object up in the
   content-addressed cache (:func:`object_key`: source sha256, compile
   options and environment, target arch, compiler and inspector
   fingerprints, compile protocol);
3. compile all misses on the executor (local pool or Ray) in one batch,
   keeping going past failures; each worker also inspects its cubin
   (registers, spills, shared memory, SASS census);
4. check each fresh object's toolchain, cubin target and traced shared-memory
   size against this build's, the requested arch and the validator's model,
   and cache it at once; a kernel that fails (here or in its worker) gets a
   diagnostic with a compile-stage id (``builder.compile.job.COMPILE_HINTS``)
   located at its catalog entry;
5. link the passing kernels into one library for the catalog's glibc target
   (cached by its inputs), fail with GLIBC-TARGET if it needs a newer glibc
   (``builder/package/platform_tag.py``), and put the bundle in place atomically, under its lock, leaving a bundle that is
   already current untouched (``builder/package/publish.py``); a ``--shard`` build
   writes its shard directory instead (``builder/pipeline/shard.py``, combined by
   ``builder/pipeline/merge.py``).

A failed kernel leaves the previous bundle in place (the report goes beside
it) unless ``allow_partial`` asks for a bundle of what passed.
"""

from __future__ import annotations

import fnmatch
import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Mapping

from builder.check.context import KernelContext
from builder.check.validate import Project, Validation, validate_project
from builder.cli.progress import BuildProgress
from builder.compile.cache import CacheEntry, ContentCache, canonical_key
from builder.compile.claims import Claims
from builder.compile.cubin import compiled_for
from builder.compile.job import (
    COMPILE_ARCH_DRIFT,
    COMPILE_ENV,
    COMPILE_HINTS,
    COMPILE_SMEM_DRIFT,
    TOOLCHAIN_MISMATCH,
    CompileFailure,
    CompileJob,
    CompileOutput,
)
from builder.compile.parallel import Executor
from builder.compile.records import BuildRecord, record_from_meta
from builder.compile.toolchain import compiler_fingerprint, inspector_fingerprint, toolchain
from builder.diagnostics import Diagnostic, DiagnosticError, Location, Severity, did_you_mean
from builder.load.paths import display_path
from builder.load.yamlsrc import load_yaml
from builder.package.bundle import BundleFile, bundle_name, library_name, source_file, write_bundle
from builder.package.link import link_input, link_library, link_recipe, render_glue
from builder.package.manifest import make_manifest
from builder.package.platform_tag import GlibcTarget, platform_tag
from builder.package.publish import REPORT_NAME, bundle_is_current, bundle_output, publish_failure_report
from builder.pipeline.shard import write_shard
from builder.render import render_kernel
from tilekiln._files import write_atomic

# Bump when compile.py changes what it feeds the DSL or how it exports.
# 2: workers drop the caller's CUTE_DSL_* variables; results carry the toolchain.
# 3: the census comes from nvdisasm -c -ndf (same counts, other tool, so new metadata).
# 4: the census also counts UGETNEXTWORKID (cluster launch control), absent from older metadata.
COMPILE_PROTOCOL = 4


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

    def unsharded(self) -> "Selection":
        return Selection(self.pipelines, self.arches, self.only)

    def describe(self) -> dict[str, tuple[str, ...]]:
        return {"pipelines": self.pipelines, "arches": self.arches, "only": self.only}


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
class PlannedKernel:
    """One kernel for one target, rendered, with the cache key of its object."""

    arch: str
    ctx: KernelContext
    job: CompileJob
    key: str

    @property
    def kernel_id(self) -> str:
        return self.job.kernel_id


@dataclass(frozen=True)
class BundleResult:
    """One bundle's outcome; for a shard build, ``path`` is the shard directory."""

    bundle: str
    arch: str
    records: tuple[BuildRecord, ...]
    path: Path | None
    report_path: Path
    shard: tuple[int, int] | None = None
    unchanged: bool = False  # the bundle on disk already held exactly this build's output

    @property
    def failed(self) -> tuple[BuildRecord, ...]:
        return tuple(r for r in self.records if not r.ok)


@dataclass(frozen=True)
class BuildResult:
    bundles: tuple[BundleResult, ...]
    diagnostics: tuple[Diagnostic, ...] = field(default_factory=tuple)  # the catalog's warnings

    @property
    def ok(self) -> bool:
        return all(not b.failed for b in self.bundles)

    @property
    def failures(self) -> tuple[Diagnostic, ...]:
        """The diagnostic of every failed kernel of every bundle (one per kernel and target)."""
        return tuple(r.diagnostic for b in self.bundles for r in b.failed if r.diagnostic is not None)


def validated(root: Path) -> Validation:
    validation = validate_project(Project(root))
    errors = [d for d in validation.diagnostics if d.severity is Severity.ERROR]
    if errors:
        raise DiagnosticError(errors)
    return validation


def plan(validation: Validation, selection: Selection) -> list[PlannedKernel]:
    """Render every selected kernel and key its object; no file is read but the templates."""
    out = []
    for arch, ctx in selection.planned(validation):
        job = CompileJob(ctx.entry.kernel_id, arch, render_kernel(ctx).text)
        out.append(PlannedKernel(arch, ctx, job, object_key(job)))
    return out


def build(request: BuildRequest) -> BuildResult:
    validation = validated(request.root)
    arches = sorted({a for a, _ in request.selection.unsharded().planned(validation)})
    if not arches:
        raise DiagnosticError([_empty_selection(validation, request.selection)])
    planned = plan(validation, request.selection)
    cache = ContentCache(request.cache_dir)
    cache.sweep()
    records = compile_kernels(planned, cache, request, f"building {', '.join(bundle_name(a) for a in arches)}")
    results = []
    for arch in arches:
        mine = [r for r in records if r.arch == arch]
        if request.selection.shard is None:
            results.append(write_bundle_for(arch, mine, validation, cache, request))
        else:
            results.append(write_shard_for(arch, mine, request))
    return BuildResult(tuple(results), tuple(validation.diagnostics))


def _empty_selection(validation: Validation, selection: Selection) -> Diagnostic:
    pipelines = sorted({ctx.entry.config.pipeline for ctx in validation.kernels})
    arches = sorted({a for ctx in validation.kernels for a in ctx.entry.targets})
    close = []
    for option, given, known in (("--pipeline", selection.pipelines, pipelines), ("--arch", selection.arches, arches)):
        for value in given:
            match = None if value in known else did_you_mean(value, known)
            if match:
                close.append(f"{option} {match}")
    return Diagnostic("BUILD-EMPTY", "the selection matches no kernel", Location("catalog"),
                      (f"did you mean {', '.join(close)}? " if close else "")
                      + f"check --pipeline, --arch and --only; the catalog has pipelines {', '.join(pipelines)} "
                      f"and targets {', '.join(arches)}; `tilekiln list` shows the kernel ids",
                      facts={k: list(v) for k, v in selection.describe().items()} | {"did_you_mean": close})


def object_key(job: CompileJob) -> str:
    """Everything that decides the cached object and its metadata, and nothing else."""
    return canonical_key({"kind": "kernel", "protocol": COMPILE_PROTOCOL, "arch": job.arch,
                          "options": job.options, "env": [list(e) for e in COMPILE_ENV],
                          "source_sha256": hashlib.sha256(job.source.encode()).hexdigest(),
                          "compiler": compiler_fingerprint(), "inspector": inspector_fingerprint()})


def compile_kernels(planned: list[PlannedKernel], cache: ContentCache, request: BuildRequest,
                    label: str) -> list[BuildRecord]:
    """Records of ``planned``, by (arch, id): cache hits, then the misses as the executor finishes them.

    The misses this build can claim (:mod:`builder.compile.claims`) go to the
    executor in one batch, so its workers stay busy across bundles. Each fresh
    object goes into the cache as soon as it is checked, so a build killed
    midway resumes from every kernel it finished. Misses another build is
    compiling come next: this build waits for that build's claim and finds the
    object in the cache, or compiles it when that build failed or died.
    """
    records: dict[tuple[str, str], BuildRecord] = {}
    misses: list[PlannedKernel] = []
    for p in planned:
        hit = cache.get("kernel", p.key)
        if hit is None:
            misses.append(p)
        else:
            records[p.arch, p.kernel_id] = _cached(p, hit)
    with BuildProgress(request.progress, len(planned), label, cached=len(records)) as progress, \
            Claims(cache.root, "kernel") as claims, cache.scratch("compile") as scratch:
        todo = misses
        while todo:
            mine, todo = claims.take(todo, lambda p: p.key)
            if not mine:
                claims.wait(todo[0].key)
                mine, todo = todo[:1], todo[1:]
            compile_now = {}
            for p in mine:
                # Claimed now, so any entry is complete: a build that held the claim committed it.
                hit = cache.get("kernel", p.key)
                if hit is None:
                    compile_now[p.arch, p.kernel_id] = p
                    continue
                claims.release(p.key)
                record = records[p.arch, p.kernel_id] = _cached(p, hit)
                progress.advance(record.kernel_id, record.status, record.seconds, bundle_name(record.arch))
            for result in request.executor.run([p.job for p in compile_now.values()], scratch):
                p = compile_now[result.arch, result.kernel_id]
                record = records[p.arch, p.kernel_id] = _record_from_result(p, result, cache)
                claims.release(p.key)
                progress.advance(record.kernel_id, record.status, record.seconds, bundle_name(record.arch))
    return [records[k] for k in sorted(records)]


def _cached(p: PlannedKernel, hit: CacheEntry) -> BuildRecord:
    return record_from_meta(p.kernel_id, p.arch, "cached", hit.meta["seconds"], hit.meta, ctx=p.ctx,
                            source=p.job.source, key=p.key, object_bytes=hit.read("kernel.o"),
                            cubin=hit.read("kernel.cubin"))


def _record_from_result(p: PlannedKernel, result: CompileOutput | CompileFailure,
                        cache: ContentCache) -> BuildRecord:
    if isinstance(result, CompileFailure):
        return _failed(p, result.seconds, result.rule, result.message, result.facts)
    drift = _drift(p, result)
    if drift is not None:
        return _failed(p, result.seconds, *drift)
    ctx, job, cubin, info = p.ctx, p.job, result.cubin, result.info
    record = BuildRecord(job.kernel_id, job.arch, "compiled", result.seconds, ctx=ctx, source=job.source,
                          object_bytes=result.object_bytes, cubin=cubin, info=info, entry=result.entry, key=p.key,
                          traced_smem_bytes=result.traced_smem_bytes)
    cache.put("kernel", p.key, {"kernel.o": result.object_bytes, "kernel.cubin": cubin},
              {"seconds": result.seconds, **record.artifact_meta()})
    return record


def _failed(p: PlannedKernel, seconds: float, rule: str, message: str, facts: Mapping[str, object]) -> BuildRecord:
    """A failed record with its diagnostic: the compile-stage id, the kernel id as subject, its catalog
    entry as location and the target among the facts (one kernel id compiles for several targets)."""
    job = p.job
    problem = Diagnostic(rule, message, p.ctx.entry.locate(), COMPILE_HINTS.get(rule, ""),
                         facts={"arch": job.arch, **facts}, subject=job.kernel_id)
    return BuildRecord(job.kernel_id, job.arch, "failed", seconds, error=message, ctx=p.ctx, source=job.source,
                       key=p.key, diagnostic=problem)


def _drift(p: PlannedKernel, result: CompileOutput) -> tuple[str, str, dict[str, object]] | None:
    """(id, message, facts) if a fresh object is not what this build asked for: another toolchain made it,
    its cubin targets another arch, or its shared memory is not what the validator modelled (the plan
    the template was rendered from); None if it is."""
    job, smem, info = p.job, p.ctx.plan.smem, result.info
    local = (compiler_fingerprint(), inspector_fingerprint())
    if result.toolchain != local:
        return (TOOLCHAIN_MISMATCH, f"the worker that compiled this kernel has toolchain "
                f"{'/'.join(t[:12] for t in result.toolchain)}, this build {'/'.join(t[:12] for t in local)}",
                {"worker_toolchain": list(result.toolchain), "build_toolchain": list(local)})
    try:
        target = compiled_for(result.cubin)
    except RuntimeError as exc:
        return (COMPILE_ARCH_DRIFT, f"{exc}, so its target cannot be checked against the requested {job.arch}",
                {"requested_arch": job.arch, "cubin_arch": None})
    if target != job.arch:
        return (COMPILE_ARCH_DRIFT, f"the cubin was assembled for {target}, not the requested target {job.arch}",
                {"requested_arch": job.arch, "cubin_arch": target})
    if result.traced_smem_bytes != smem.dynamic_bytes or info.static_smem_bytes != smem.static_bytes:
        return (COMPILE_SMEM_DRIFT, f"compiled for {job.arch}, the kernel uses {result.traced_smem_bytes} B dynamic "
                f"+ {info.static_smem_bytes} B static shared memory but the validator's model says "
                f"{smem.dynamic_bytes} + {smem.static_bytes}",
                {"traced_bytes": result.traced_smem_bytes, "model_bytes": smem.dynamic_bytes,
                 "static_bytes": info.static_smem_bytes, "model_static_bytes": smem.static_bytes})
    return None


def _report_bytes(arch: str, records: list[BuildRecord], shard: tuple[int, int] | None = None) -> bytes:
    passed = sum(r.ok for r in records)
    report = {"bundle": bundle_name(arch), "arch": arch, "kernels": [r.report() for r in records],
              "passed": passed, "failed": len(records) - passed}
    if shard is not None:
        report["shard"] = list(shard)
    return (json.dumps(report, indent=2) + "\n").encode()


def write_bundle_for(arch: str, records: list[BuildRecord], validation: Validation, cache: ContentCache,
                     request: BuildRequest) -> BundleResult:
    """Link what passed and put the bundle in place, unless a failure keeps the previous one."""
    bundle = bundle_name(arch)
    passed = [r for r in records if r.ok]
    failed = [r for r in records if not r.ok]
    report_bytes = _report_bytes(arch, records)
    if (failed and not request.allow_partial) or not passed:
        report_path = publish_failure_report(request.out_dir, bundle, report_bytes)
        return BundleResult(bundle, arch, tuple(records), None, report_path)
    target = glibc_target(request.root, validation)
    library = link_cached(bundle, passed, cache, target.version)
    # The wheel will promise this glibc: a library that needs a newer one fails the build here.
    platform_tag(library, f"{bundle}/lib/{library_name(bundle)}", target)
    # Each kernel's cubin is inside the library already (its fatbin); the manifest keeps
    # the cubin's sha256 and size, so the bundle stores every byte of device code once.
    files = [BundleFile(f"lib/{library_name(bundle)}", library)]
    files += [BundleFile(source_file(r.kernel_id), r.source.encode()) for r in passed]
    manifest = make_manifest(arch, passed, validation, request.root).plain()
    with bundle_output(request.out_dir, bundle) as path:
        unchanged = bundle_is_current(path, files, manifest)
        if unchanged:
            write_atomic(path / REPORT_NAME, report_bytes)
        else:
            write_bundle(request.out_dir, bundle, files, manifest, extra={REPORT_NAME: report_bytes})
    return BundleResult(bundle, arch, tuple(records), path, path / REPORT_NAME, unchanged=unchanged)


def write_shard_for(arch: str, records: list[BuildRecord], request: BuildRequest) -> BundleResult:
    index, count = request.selection.shard
    path = write_shard(request.out_dir, arch, index, count, request.selection.describe(), records,
                       _report_bytes(arch, records, request.selection.shard))
    return BundleResult(bundle_name(arch), arch, tuple(records), path, path / REPORT_NAME, (index, count))


def glibc_target(root: Path, validation: Validation) -> GlibcTarget:
    """The catalog's glibc target, located at its line of catalog/catalog.yaml for the diagnostic that cites it."""
    path = Project(root).catalog_dir / "catalog.yaml"
    location = load_yaml(path, display_path(path, root)).locate(("glibc",))
    return GlibcTarget(validation.catalog.settings.glibc_version, location)


def link_cached(bundle: str, records: list[BuildRecord], cache: ContentCache, glibc: tuple[int, int]) -> bytes:
    """The bundle's library, keyed by every link input: glue, objects, shim, flags, glibc target and toolchain."""
    inputs = [link_input(r) for r in records]
    key = canonical_key({"kind": "library", "glue": render_glue(bundle, inputs), "recipe": link_recipe(),
                         "objects": [hashlib.sha256(r.object_bytes).hexdigest() for r in records],
                         "glibc": list(glibc), "toolchain": toolchain().fingerprint, "bundle": bundle})
    hit = cache.get("library", key)
    if hit is not None:
        return hit.read("lib.so")
    # The file name becomes the soname, so it is the library's own, in a private directory.
    with cache.scratch("link") as work:
        out = work / library_name(bundle)
        link_library(bundle, inputs, out, glibc)
        data = out.read_bytes()
    cache.put("library", key, {"lib.so": data}, {"bundle": bundle})
    return data
