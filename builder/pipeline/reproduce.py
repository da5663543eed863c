"""``tilekiln build --check-reproducible``: build again from nothing and compare every artifact.

The second build runs with the same project, selection and executor but an
empty cache and output directory in a scratch directory of the cache, so every kernel
is compiled and every library linked afresh. Then the sha256 of every file
of every output the first build wrote (bundle or shard directory) must equal
the rebuild's; ``build-report.json`` is left out, as it holds timings and
statuses and is not an artifact.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

from builder.compile.cache import ContentCache
from builder.diagnostics import Diagnostic, Location
from builder.package.publish import tree_digests
from builder.pipeline.build import BuildRequest, BuildResult, build


@dataclasses.dataclass(frozen=True)
class ReproducibilityCheck:
    compared: int  # files
    diagnostics: tuple[Diagnostic, ...]

    @property
    def ok(self) -> bool:
        return not self.diagnostics


def check_reproducible(request: BuildRequest, first: BuildResult) -> ReproducibilityCheck:
    # In the cache's scratch space, which the next build sweeps if this one is killed.
    with ContentCache(request.cache_dir).scratch("reproduce") as tmp:
        again = build(dataclasses.replace(request, out_dir=tmp / "out", cache_dir=tmp / "cache"))
        compared, problems = 0, []
        for a, b in zip(first.bundles, again.bundles, strict=True):
            if a.path is None:
                continue
            if b.path is None:
                problems.append(Diagnostic("BUILD-NOT-REPRODUCIBLE", f"{a.bundle}: the clean rebuild wrote no output "
                                           f"({len(b.failed)} kernels failed there)", Location(str(a.path)),
                                           "see the failures of the clean rebuild above"))
                continue
            found = compare_trees(a.path, b.path, request.out_dir)
            compared += len(tree_digests(a.path))
            problems.extend(found)
    return ReproducibilityCheck(compared, tuple(problems))


def compare_trees(built: Path, rebuilt: Path, display_root: Path) -> list[Diagnostic]:
    """One diagnostic per file that differs, is missing or is extra in ``rebuilt``."""
    mine, theirs = tree_digests(built) or {}, tree_digests(rebuilt) or {}
    problems = []
    try:
        shown = built.relative_to(display_root)
    except ValueError:
        shown = built
    for name in sorted(mine.keys() | theirs.keys()):
        where = Location(str(shown / name))
        if name not in theirs:
            problems.append(Diagnostic("BUILD-NOT-REPRODUCIBLE", "the clean rebuild did not write this file", where,
                                       "an output that depends on the cache or on earlier builds"))
        elif name not in mine:
            problems.append(Diagnostic("BUILD-NOT-REPRODUCIBLE", "only the clean rebuild wrote this file", where,
                                       "an output that depends on the cache or on earlier builds"))
        elif mine[name] != theirs[name]:
            problems.append(Diagnostic(
                "BUILD-NOT-REPRODUCIBLE", f"differs: sha256 {mine[name][:16]}... in this build, "
                f"{theirs[name][:16]}... in a clean rebuild", where,
                "something nondeterministic reaches this file (a time, a path, a random name)",
                facts={"built": mine[name], "rebuilt": theirs[name]}))
    return problems
