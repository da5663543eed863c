"""The contents of a bundle's ``manifest.json`` (format: docs/bundle-format.md).

:func:`make_manifest` turns the kernels that passed a build into the typed
:class:`tilekiln.manifest.Manifest` the runtime reads back (its kernel records
are tilekiln/spec.py's); ``builder/package/bundle.py`` adds the file hashes and the
self digest when it writes the bundle.
"""

from __future__ import annotations

import hashlib
import platform
import subprocess
from pathlib import Path
from typing import TYPE_CHECKING

import tilekiln
from builder import __version__
from builder.check.derive import Tcgen05Plan
from builder.compile.toolchain import driver_floor, toolchain
from builder.load.tuning import read_tuning
from builder.load.verification import VerificationFile, read_verification
from builder.package.bundle import bundle_name, library_name, source_file
from tilekiln.manifest import ABI_VERSION, BundleInfo, Manifest, Provenance, TuningTable
from tilekiln.spec import Blob, CatalogRef, KernelRecord, Resources, Symbols, TemplateRef
from tilekiln.splitk import parse_label

if TYPE_CHECKING:
    from builder.check.validate import Validation
    from builder.compile.records import BuildRecord

# Major: a change a reader of the previous major cannot ignore (a field removed,
# renamed or given a new meaning). Minor: fields added that old readers skip.
# 2.0: each kernel record is tilekiln/spec.py's KernelRecord (its config under
# `config`, every field of the spec), written and read through one definition.
# 2.2: `config.bias` (absent: none).
# 2.3: `config.residual` (absent: none) and `config.scaling` rowwise.
# 2.4: `config.scalars` (absent: none).
# 2.5: `config.scheduler` (absent: static) and the census opcode UGETNEXTWORKID in `resources.sass`.
# 2.6: `resources.oversized_smem` (absent: false), true for a kernel loaded on the oversized carveout.
# 2.7: `tuning_tables`, one build-time table per SKU with the card's facts, in place of the single
# `tuning` table (a runtime that reads 2.7 reads a 2.6 `tuning` as one table; an older runtime
# finds no `tuning` in a 2.7 manifest and selects by its model).
MANIFEST_SCHEMA_VERSION = "2.7"


def runtime_requirement(runtime_version: str) -> str:
    """The runtime versions a bundle built next to ``runtime_version`` can run under.

    The runtime's versioning promise: a release that changes which manifest
    schema major or library ABI it reads bumps the minor version while below
    1.0 and the major version after. So ``0.1.x`` runtimes read what ``0.1.0``
    wrote and ``0.2`` may not: ``0.1.0`` -> ``>=0.1,<0.2``, ``1.4.2`` -> ``>=1.4,<2``.
    """
    major, minor = (int(p) for p in runtime_version.split(".")[:2])
    upper = f"{major}.{minor + 1}" if major == 0 else f"{major + 1}"
    return f">={major}.{minor},<{upper}"


def make_manifest(arch: str, records: list[BuildRecord], validation: Validation, root: Path) -> Manifest:
    """The manifest of one bundle (``files`` empty: the writer adds them, then the self digest)."""
    target = records[0].ctx.facts.target(arch)
    tools = toolchain()
    verification = read_verification(root, bundle_name(arch))
    settings = validation.catalog.settings
    return Manifest(
        schema_version=MANIFEST_SCHEMA_VERSION,
        bundle=BundleInfo(
            name=bundle_name(arch), version=settings.version, arch=arch, arch_kind=target.kind,
            compute_capability=target.compute_capability, abi_version=ABI_VERSION,
            runtime_requires=runtime_requirement(tilekiln.__version__), driver_requires=driver_floor(),
            glibc=settings.glibc),
        library=f"lib/{library_name(bundle_name(arch))}",
        files=(),
        kernels=tuple(_kernel(index, r, verification) for index, r in enumerate(records)),
        toolchain=tuple(sorted({"builder": __version__, **dict(tools.versions), "cc": tools.cc_version}.items())),
        provenance=Provenance(git_commit(root), f"{platform.machine()}-{platform.system().lower()}",
                              tuple(validation.catalog.files)),
        tuning_tables=tuple(sorted((_tuning(data, {r.kernel_id for r in records})
                                    for data in read_tuning(root, bundle_name(arch))), key=lambda t: t.device)),
    )


def _tuning(data: dict, kernel_ids: set[str]) -> TuningTable:
    """One committed tuning table of the bundle (builder/load/tuning.py, which validated it).

    Buckets whose kernel is not in this bundle (removed from the catalog, or
    left out by ``--only``) are dropped: the runtime falls back to its model there.
    """
    table = {bucket: choice for bucket, choice in data["table"].items() if parse_label(choice)[0] in kernel_ids}
    measurements = {bucket: m for bucket, m in data.get("measurements", {}).items() if bucket in table}
    return TuningTable.from_plain({**data, "table": table, "measurements": measurements})


def _kernel(index: int, r: BuildRecord, verification: VerificationFile | None) -> KernelRecord:
    ctx = r.ctx
    plan, template = ctx.plan, ctx.template
    cubin_sha256 = hashlib.sha256(r.cubin).hexdigest()
    return KernelRecord(
        index=index, id=r.kernel_id, config=ctx.entry.config, stages=plan.stages, threads=plan.threads,
        contract=plan.contract,
        resources=Resources(registers=r.info.registers, smem_bytes=plan.smem.total,
                            static_smem_bytes=r.info.static_smem_bytes, stack_bytes=r.info.stack_bytes,
                            local_bytes=r.info.local_bytes, spills=r.info.spills, sass=dict(r.info.census),
                            oversized_smem=isinstance(plan, Tcgen05Plan) and plan.oversized_launch),
        cubin=Blob(cubin_sha256, len(r.cubin)),
        source=Blob(hashlib.sha256(r.source.encode()).hexdigest(), len(r.source.encode()), source_file(r.kernel_id)),
        symbols=Symbols(r.entry.prefix, r.entry.init, r.entry.load_to_device, r.entry.launch),
        catalog=CatalogRef(ctx.entry.file, ctx.entry.item), template=TemplateRef(template.name, template.source_sha256),
        # builder/load/verification.py: a GPU run of exactly this cubin, per card model
        verified_on=verification.verified_on(r.kernel_id, cubin_sha256) if verification else (),
    )


def git_commit(root: Path) -> str:
    """HEAD of the checkout at ``root``, ``-dirty`` when tracked files differ, ``unknown`` outside git."""
    try:
        head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=root, capture_output=True, text=True, timeout=10)
        if head.returncode != 0:
            return "unknown"
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=root,
                               capture_output=True, text=True, timeout=10).stdout.strip()
        return head.stdout.strip() + ("-dirty" if dirty else "")
    except (OSError, subprocess.TimeoutExpired):
        return "unknown"
