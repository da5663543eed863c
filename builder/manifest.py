"""The contents of a bundle's ``manifest.json`` (format: docs/bundle-format.md).

:func:`make_manifest` turns the kernels that passed a build into the manifest
dictionary; ``builder/bundle.py`` adds the file hashes and the self digest
when it writes the bundle. The runtime reads it with ``tilekiln/manifest.py``,
so a field added here is added to the spec and, if the runtime needs it, to
that reader in the same change.
"""

from __future__ import annotations

import hashlib
import platform
import subprocess
from pathlib import Path
from typing import TYPE_CHECKING

import tilekiln
from builder import __version__
from builder.bundle import bundle_name, library_name, source_file
from builder.toolchain import driver_floor, toolchain
from builder.tuning import read_tuning
from builder.verification import VerificationFile, read_verification
from tilekiln.manifest import ABI_VERSION
from tilekiln.splitk import parse_label

if TYPE_CHECKING:
    from builder.build import KernelRecord
    from builder.validate import Validation

# Major: a change a reader of the previous major cannot ignore (a field removed,
# renamed or given a new meaning). Minor: fields added that old readers skip.
# 1.3: cubins live only inside the library (no cubins/ files, no cubin.file; no
# reader ever opened one), sources are sources/<id>.py.txt, bundle.glibc,
# bundle.driver_requires and each kernel's verified_on.
MANIFEST_SCHEMA_VERSION = "1.3"


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


def make_manifest(arch: str, records: list[KernelRecord], validation: Validation, root: Path) -> dict:
    """The manifest of one bundle (without ``files`` and ``integrity``, which the writer adds)."""
    target = records[0].ctx.facts.target(arch)
    tools, floor = toolchain(), driver_floor()
    verification = read_verification(root, bundle_name(arch))
    return {
        "schema_version": MANIFEST_SCHEMA_VERSION,
        "bundle": {"name": bundle_name(arch), "version": validation.catalog.settings.version,
                   "arch": arch, "arch_kind": target.kind,
                   "compute_capability": list(target.compute_capability), "abi_version": ABI_VERSION,
                   "runtime_requires": runtime_requirement(tilekiln.__version__),
                   "driver_requires": {"cuda_version": floor.cuda_version, "linux_driver": floor.linux_driver},
                   "glibc": validation.catalog.settings.glibc},
        "library": f"lib/{library_name(bundle_name(arch))}",
        "toolchain": {"builder": __version__, **dict(tools.versions), "cc": tools.cc_version},
        "provenance": {"git_commit": git_commit(root),
                       "build_host": f"{platform.machine()}-{platform.system().lower()}",
                       "catalog_files": list(validation.catalog.files)},
        "kernels": [_kernel(index, r, verification) for index, r in enumerate(records)],
        **_tuning(root, bundle_name(arch), {r.kernel_id for r in records}),
    }


def _tuning(root: Path, bundle: str, kernel_ids: set[str]) -> dict:
    """The committed tuning table of the bundle (builder/tuning.py), if any.

    Buckets whose kernel is not in this bundle (removed from the catalog, or
    left out by ``--only``) are dropped: the runtime falls back to its model there.
    """
    data = read_tuning(root, bundle)
    if data is None:
        return {}
    table = {bucket: choice for bucket, choice in data.get("table", {}).items()
             if parse_label(choice)[0] in kernel_ids}
    measurements = {bucket: m for bucket, m in data.get("measurements", {}).items() if bucket in table}
    return {"tuning": {"device": data.get("device", "unknown"), "table": dict(sorted(table.items())),
                       "measurements": dict(sorted(measurements.items()))}}


def _kernel(index: int, r: KernelRecord, verification: VerificationFile | None) -> dict:
    ctx = r.ctx
    cfg, plan = ctx.entry.config, ctx.plan
    cubin_sha256 = hashlib.sha256(r.cubin).hexdigest()
    verified_on = verification.verified_on(r.kernel_id, cubin_sha256) if verification else []
    return {
        "index": index,
        "id": r.kernel_id,
        "pipeline": cfg.pipeline,
        "dtypes": {"a": cfg.dtypes.a.value, "b": cfg.dtypes.b.value, "acc": cfg.dtypes.acc.value,
                   "c": cfg.dtypes.c.value},
        "layout": {"code": cfg.layout.code, "a": "k" if cfg.layout.a_k_major else "m",
                   "b": "k" if cfg.layout.b_k_major else "n", "c": "n"},
        "tile": [cfg.tile.m, cfg.tile.n, cfg.tile.k],
        "cluster": [cfg.cluster.m, cfg.cluster.n],
        "cta_group": cfg.cta_group,
        "block_scale": None if cfg.block_scale is None else {"scale": cfg.block_scale.scale.value,
                                                             "block": cfg.block_scale.block},
        "schedule": cfg.schedule.value,
        "swap_ab": cfg.swap_ab,
        "raster": cfg.raster.value,
        "swizzle": cfg.swizzle,
        "evict_first": sorted(o.value for o in cfg.evict_first),
        "stages": plan.stages,
        "threads": plan.threads,
        "contract": plan.contract.plain(),
        "resources": {"registers": r.info.registers, "smem_bytes": plan.smem.total,
                      "static_smem_bytes": r.info.static_smem_bytes, "stack_bytes": r.info.stack_bytes,
                      "local_bytes": r.info.local_bytes, "spills": r.info.spills,
                      "sass": dict(r.info.census)},
        "source": {"file": source_file(r.kernel_id), "sha256": hashlib.sha256(r.source.encode()).hexdigest()},
        "cubin": {"sha256": cubin_sha256, "bytes": len(r.cubin)},
        "symbols": {"prefix": r.entry.prefix, "init": r.entry.init, "load": r.entry.load_to_device,
                    "launch": r.entry.launch},
        "catalog": {"file": ctx.entry.file, "item": ctx.entry.item},
        "template": {"name": ctx.template.name, "sha256": ctx.template.source_sha256},
        # builder/verification.py: a GPU run of exactly this cubin, per card model
        "verification": "hardware-verified" if verified_on else "compile-verified",
        "verified_on": verified_on,
    }


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
