"""``tilekiln merge``: shard outputs -> the bundles a single-machine build would write.

The merge checks that the shards form one complete set (same selection,
every index 1..N for every bundle) and that they were built from this
checkout: each planned kernel must be in exactly one shard, under the cache
key this checkout computes (rendered source, options, arch, toolchain).
Then it stores the shards' objects in the cache and runs the ordinary build,
which finds every kernel cached and links and writes the bundle with the
same code as any other build; that is why the result is byte-identical to a
single-machine build. Kernels that failed in a shard fail the merge the same
way (their shard's diagnostic: id, message and facts; ``--allow-partial`` as for a build).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

from builder.compile.cache import ContentCache
from builder.compile.job import COMPILE_FAILED, CompileFailure, CompileJob
from builder.diagnostics import Diagnostic, DiagnosticError, Location
from builder.pipeline.build import BuildRequest, BuildResult, Selection, build, plan, validated
from builder.pipeline.shard import Shard, ShardKernel, load_shards


@dataclass
class ShardFailures:
    """The executor of a merge: it compiles nothing, it returns each shard's recorded failure."""

    errors: dict[tuple[str, str], CompileFailure]  # (arch, kernel id) -> the shard's failure
    name: str = "shards"

    def run(self, jobs: list[CompileJob], scratch: Path | None = None) -> Iterator[CompileFailure]:
        for job in jobs:
            yield self.errors.get((job.arch, job.kernel_id)) or CompileFailure(
                job.kernel_id, job.arch, "the merge found no object for this kernel in the shards or the cache", 0.0)


def shard_failure(shard: Shard, kernel_id: str, arch: str, row: dict, seconds: float) -> CompileFailure:
    """A kernel that failed in ``shard``, as its shard's report recorded it: the compile-stage id, message and
    facts of its diagnostic (the merge locates it in this checkout's catalog again)."""
    recorded = row.get("diagnostic") if isinstance(row.get("diagnostic"), dict) else {}
    message = recorded.get("message") or row.get("error") or f"failed in shard {shard.index}/{shard.count}"
    return CompileFailure(kernel_id, arch, message, seconds, recorded.get("rule") or COMPILE_FAILED,
                          recorded.get("facts") or {})


def merge(root: Path, shard_paths: list[Path], out_dir: Path, cache_dir: Path, allow_partial: bool = False,
          progress: str = "auto") -> BuildResult:
    shards = load_shards(shard_paths)
    selection = _common_selection(shards)
    by_kernel = _check_against_checkout(root, shards, selection)
    cache = ContentCache(cache_dir)
    errors: dict[tuple[str, str], CompileFailure] = {}
    for (arch, kernel_id), (shard, kernel) in sorted(by_kernel.items()):
        row = shard.report_rows().get(kernel_id, {})
        seconds = float(row.get("compile_seconds", 0.0))
        if not kernel.ok:
            errors[arch, kernel_id] = shard_failure(shard, kernel_id, arch, row, seconds)
        elif cache.get("kernel", kernel.key) is None:
            files = {"kernel.o": shard.read(kernel.object_file, kernel.object_sha256),
                     "kernel.cubin": shard.read(kernel.cubin_file, kernel.cubin_sha256)}
            cache.put("kernel", kernel.key, files, {"seconds": seconds, **kernel.meta})
    return build(BuildRequest(root=root, out_dir=out_dir, cache_dir=cache_dir, executor=ShardFailures(errors),
                              selection=selection, allow_partial=allow_partial, progress=progress))


def _common_selection(shards: list[Shard]) -> Selection:
    first = shards[0]
    for s in shards[1:]:
        if (s.count, dict(s.selection)) != (first.count, dict(first.selection)):
            raise DiagnosticError([Diagnostic(
                "SHARD-MIXED", f"{s.path} is shard {s.index}/{s.count} of selection {dict(s.selection)}, "
                f"but {first.path} is of {first.count} shards of selection {dict(first.selection)}",
                Location(str(s.path)), "merge the shards of one `tilekiln build --shard I/N` run")])
    problems = []
    for bundle in sorted({s.bundle for s in shards}):
        indices = sorted(s.index for s in shards if s.bundle == bundle)
        missing = sorted(set(range(1, first.count + 1)) - set(indices))
        repeated = sorted({i for i in indices if indices.count(i) > 1})
        if missing or repeated:
            problems.append(Diagnostic(
                "SHARD-INCOMPLETE", f"bundle {bundle}: " + "; ".join(
                    ([f"shards {', '.join(f'{i}/{first.count}' for i in missing)} missing"] if missing else []) +
                    ([f"shards {', '.join(map(str, repeated))} given twice"] if repeated else [])),
                Location(str(first.path.parent)), "pass every shard directory exactly once"))
    if problems:
        raise DiagnosticError(problems)
    arches = tuple(sorted({s.arch for s in shards}))
    return Selection(first.selection["pipelines"], arches, first.selection["only"])


def _check_against_checkout(root: Path, shards: list[Shard],
                            selection: Selection) -> dict[tuple[str, str], tuple[Shard, ShardKernel]]:
    by_kernel = {(s.arch, k.kernel_id): (s, k) for s in shards for k in s.kernels}
    planned = {(p.arch, p.kernel_id): p for p in plan(validated(root), selection)}
    problems = []
    for arch, kernel_id in sorted(planned.keys() - by_kernel.keys()):
        problems.append(Diagnostic("SHARD-CATALOG", f"is in the catalog for {arch} but in no shard",
                                   Location("catalog"), "build the shards from the same commit as the merge",
                                   facts={"arch": arch}, subject=kernel_id))
    for arch, kernel_id in sorted(by_kernel.keys() - planned.keys()):
        shard = by_kernel[arch, kernel_id][0]
        problems.append(Diagnostic("SHARD-CATALOG", f"is in shard {shard.index}/{shard.count} for {arch} "
                                   "but not in the catalog", Location(str(shard.path)),
                                   "build the shards from the same commit as the merge",
                                   facts={"arch": arch, "shard": [shard.index, shard.count]}, subject=kernel_id))
    for key in sorted(planned.keys() & by_kernel.keys()):
        shard, kernel = by_kernel[key]
        if kernel.key != planned[key].key:
            problems.append(Diagnostic(
                "SHARD-STALE", f"for {key[0]} in shard {shard.index}/{shard.count} was compiled from other "
                "inputs (source, options or toolchain) than this checkout would use", Location(str(shard.path)),
                "build the shards and merge from the same commit with the same tilekiln-build wheels",
                facts={"arch": key[0], "shard": [shard.index, shard.count], "shard_key": kernel.key,
                       "checkout_key": planned[key].key}, subject=key[1]))
    if problems:
        raise DiagnosticError(problems)
    return by_kernel
