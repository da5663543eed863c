"""What ``tilekiln inspect`` and ``tilekiln diff`` report about bundles and bundle wheels.

``inspect``: the kernels (id, dtypes, layout, tile, cluster, registers,
shared memory, cubin size, the matrix instructions of the SASS census, verification
status; in JSON the whole census), the integrity check and the provenance. ``diff``: kernels added, removed and changed (every manifest
field that differs, apart from its position and symbol names), bundle-level
changes (version, toolchain, provenance, tuning table) and the size delta. Each has a JSON
form (``--format json``) and a text form printed with rich. The tuning table is the one the
bundle selects by, one per SKU: the manifest's, with a directory's tuning file over them (``Artifact.tables``).
"""

from __future__ import annotations

from dataclasses import dataclass

from rich import box
from rich.console import Console
from rich.measure import Measurement
from rich.table import Table

from builder.package.artifact import Artifact
from builder.package.wheel import RUNTIME_DISTRIBUTION, SizeRow
from tilekiln.manifest import MANIFEST_NAME, Sku
from tilekiln.spec import Scheduler
from tilekiln.tuning.table import TUNING_NAME, table_of

# Kernel fields that differ between equal kernels: the position in the table,
# the symbol names (hashes of the module name) and the catalog position.
DIFF_IGNORED = ("index", "symbols", "catalog")


# -- inspect ------------------------------------------------------------------------------------

def inspect_json(a: Artifact) -> dict:
    m = a.manifest
    plain = m.plain()
    return {
        "path": str(a.path),
        "kind": a.kind,
        "schema_version": m.schema_version,
        "bundle": plain["bundle"],
        "integrity": {"ok": not a.problem, "problem": a.problem or None},
        "kernels": [{
            "id": k.id, "config": k.config.plain(), "stages": k.stages, "registers": k.resources.registers,
            "smem_bytes": k.resources.smem_bytes, "spills": k.resources.spills, "cubin_bytes": k.cubin.bytes,
            "sass": k.resources.sass, "verification": k.verification_label, "verified_on": plain_k["verified_on"],
            "catalog": plain_k["catalog"], "template": plain_k["template"],
        } for k, plain_k in zip(m.kernels, plain["kernels"])],
        "provenance": {**plain["provenance"], "toolchain": plain["toolchain"]},
        "tuning_tables": [t.plain() for t in a.tables],
        "tuning_file": [t.plain() for t in a.tuning_file],
        "size": {"files": dict(a.sizes), "total_bytes": a.total_bytes,
                 "archive_bytes": a.wheel.archive_bytes if a.wheel else None},
        "wheel": None if a.wheel is None else {
            "filename": a.wheel.filename, "distribution": a.wheel.distribution, "version": a.wheel.version,
            "requires": list(a.wheel.requires), "tag": a.wheel.tag},
    }


def print_inspect(a: Artifact, console: Console) -> None:
    m, b = a.manifest, a.manifest.bundle
    console.print(f"{m.name} {m.version}: {m.arch} ({_kind(m.arch_kind)}, compute capability "
                  f"{m.compute_capability[0]}.{m.compute_capability[1]}), {len(m.kernels)} kernels; {a.kind} {a.path}")
    console.print(f"manifest schema {m.schema_version}, library ABI {b.abi_version}, "
                  f"runtime {RUNTIME_DISTRIBUTION}{b.runtime_requires}, driver for CUDA "
                  f"{b.driver_requires.cuda_version // 1000}.{b.driver_requires.cuda_version % 1000 // 10} "
                  f"(Linux {b.driver_requires.linux_driver}) or newer, glibc {b.glibc}")
    if a.wheel:
        console.print(f"wheel {a.wheel.distribution} {a.wheel.version}, tag {a.wheel.tag}, "
                      f"requires {', '.join(a.wheel.requires) or 'nothing'}")
    console.print(f"integrity: FAILED: {a.problem}" if a.problem else
                  f"integrity: ok ({len(m.files)} files match the sha256 in {MANIFEST_NAME}, and the manifest its own)")
    table = Table(box=box.SIMPLE_HEAD, pad_edge=False, show_edge=False)
    for col in ("kernel", "dtypes a,b,acc,c", "layout", "tile", "cluster", "regs", "smem B", "cubin B", "mma",
                "scheduler", "verification"):
        table.add_column(col, justify="right" if col in ("regs", "smem B", "cubin B") else "left")
    for k in m.kernels:
        c = k.config
        table.add_row(k.id, ",".join(c.dtypes.tokens), c.layout.code, f"{c.tile.m}x{c.tile.n}x{c.tile.k}",
                      f"{c.cluster.m}x{c.cluster.n}", str(k.resources.registers), str(k.resources.smem_bytes),
                      str(k.cubin.bytes), _mma(k.resources.sass), _scheduler(c.scheduler, k.resources.sass),
                      k.verification_label)
    _print_table(console, table)
    prov = m.provenance
    console.print("provenance")
    console.print(f"  git commit     {prov.git_commit}")
    console.print(f"  build host     {prov.build_host}")
    console.print(f"  catalog files  {', '.join(prov.catalog_files) or 'unknown'}")
    for (file, template, digest), items in _sources(m.kernels).items():
        console.print(f"  kernels        {len(items)} from {file} items {_ranges(items)}, "
                      f"template {template} sha256 {digest[:12]}")
    console.print("  toolchain      " + ", ".join(f"{k} {v}" for k, v in m.toolchain))
    for table in a.tables:
        tuned = table_of(a.tuning_file, table.device)
        console.print(f"  tuning         {len(table.table)} shape buckets measured on {_sku(table.sku)}"
                      + (f" ({len(tuned.table)} from {TUNING_NAME}, written by tilekiln tune after the build)"
                         if tuned else "")
                      + (f"; model fitted: {', '.join(f'{k} {v:g}' for k, v in table.model)}" if table.model else ""))
    if not a.tables:
        console.print("  tuning         none (kernels chosen by the selector's model)")
    console.print(f"size: {_bytes(a.total_bytes)} in {len(a.sizes)} files (library "
                  f"{_bytes(a.size_of(m.library) or 0)}, which holds the "
                  f"{_bytes(sum(k.cubin.bytes for k in m.kernels))} of cubins)"
                  + (f"; wheel {_bytes(a.wheel.archive_bytes)}" if a.wheel else ""))


def _sku(sku: Sku) -> str:
    """``NVIDIA H200 (sm_90, 132 SMs, 143771 MiB)``; a 2.6 manifest's table states only the name."""
    if sku.sm_count is None:
        return sku.name
    return (f"{sku.name} (sm_{sku.compute_capability[0]}{sku.compute_capability[1]}, {sku.sm_count} SMs, "
            f"{sku.memory_mib} MiB)")


def _mma(sass: dict[str, int]) -> str:
    """The matrix instructions of a SASS census and their counts, e.g. ``UTCQMMA 2``."""
    return ", ".join(f"{op} {n}" for op, n in sass.items() if op.endswith("MMA") and n) or "none"


def _scheduler(scheduler: Scheduler, sass: dict[str, int]) -> str:
    """The tile scheduler, and for clc the census count of its try_cancel (UGETNEXTWORKID), which
    shows the scheduler warp made it into the cubin."""
    if scheduler is Scheduler.STATIC:
        return scheduler.value
    return f"{scheduler.value} (UGETNEXTWORKID {sass.get('UGETNEXTWORKID', 0)})"


def _kind(kind: str) -> str:
    return {"a": "arch-specific: this compute capability only",
            "f": "family: this major version, this minor or newer"}.get(kind, f"unknown kind {kind!r}")


def _sources(kernels) -> dict[tuple[str, str, str], list[int]]:
    groups: dict[tuple[str, str, str], list[int]] = {}
    for k in kernels:
        groups.setdefault((k.catalog.file, k.template.name, k.template.sha256), []).append(k.catalog.item)
    return groups


def _ranges(items: list[int]) -> str:
    """[0, 1, 2, 5] -> '0-2, 5'"""
    values, parts, start = sorted(set(items)), [], None
    for i, v in enumerate(values):
        if start is None:
            start = v
        if i + 1 == len(values) or values[i + 1] != v + 1:
            parts.append(str(start) if start == v else f"{start}-{v}")
            start = None
    return ", ".join(parts)


# -- diff ---------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Change:
    field: str
    old: object
    new: object


@dataclass(frozen=True)
class KernelChange:
    kernel: str
    changes: tuple[Change, ...]


@dataclass(frozen=True)
class BundleDiff:
    old: Artifact
    new: Artifact
    added: tuple[str, ...]
    removed: tuple[str, ...]
    changed: tuple[KernelChange, ...]
    bundle: tuple[Change, ...]  # version, arch, toolchain, provenance

    @property
    def size_delta(self) -> int:
        return self.new.total_bytes - self.old.total_bytes

    @property
    def archive_delta(self) -> int | None:
        if self.old.wheel and self.new.wheel:
            return self.new.wheel.archive_bytes - self.old.wheel.archive_bytes
        return None


def diff_artifacts(old: Artifact, new: Artifact) -> BundleDiff:
    before = {k["id"]: k for k in old.manifest.plain()["kernels"]}
    after = {k["id"]: k for k in new.manifest.plain()["kernels"]}
    changed = []
    for kid in sorted(before.keys() & after.keys()):
        changes = _changes(_flatten(before[kid], ignore=DIFF_IGNORED), _flatten(after[kid], ignore=DIFF_IGNORED))
        if changes:
            changed.append(KernelChange(kid, changes))
    return BundleDiff(old, new, tuple(sorted(after.keys() - before.keys())),
                      tuple(sorted(before.keys() - after.keys())), tuple(changed),
                      _changes(_bundle_fields(old), _bundle_fields(new)))


def diff_json(d: BundleDiff) -> dict:
    def kernel(a: Artifact, kid: str) -> dict:
        return {"id": kid, "cubin_bytes": _cubin_bytes(a, kid)}

    return {
        "old": str(d.old.path), "new": str(d.new.path),
        "added": [kernel(d.new, kid) for kid in d.added],
        "removed": [kernel(d.old, kid) for kid in d.removed],
        "changed": [{"id": c.kernel, "fields": {x.field: [x.old, x.new] for x in c.changes}} for c in d.changed],
        "bundle": {x.field: [x.old, x.new] for x in d.bundle},
        "size": {"old_bytes": d.old.total_bytes, "new_bytes": d.new.total_bytes, "delta_bytes": d.size_delta,
                 "old_archive_bytes": d.old.wheel.archive_bytes if d.old.wheel else None,
                 "new_archive_bytes": d.new.wheel.archive_bytes if d.new.wheel else None,
                 "archive_delta_bytes": d.archive_delta},
    }


def print_diff(d: BundleDiff, console: Console) -> None:
    o, n = d.old.manifest, d.new.manifest
    console.print(f"{o.name} {o.version} ({o.arch}, {len(o.kernels)} kernels) -> "
                  f"{n.name} {n.version} ({n.arch}, {len(n.kernels)} kernels)")
    for problem, a in ((d.old.problem, d.old), (d.new.problem, d.new)):
        if problem:
            console.print(f"warning: {a.path} fails its integrity check: {problem}")
    table = Table(box=box.SIMPLE_HEAD, pad_edge=False, show_edge=False)
    for col in ("", "kernel", "cubin B", "changes"):
        table.add_column(col, justify="right" if col == "cubin B" else "left")
    for kid in d.added:
        table.add_row("+", kid, str(_cubin_bytes(d.new, kid)), "added")
    for kid in d.removed:
        table.add_row("-", kid, str(_cubin_bytes(d.old, kid)), "removed")
    for c in d.changed:
        table.add_row("~", c.kernel, _signed(_cubin_bytes(d.new, c.kernel) - _cubin_bytes(d.old, c.kernel)),
                      "; ".join(f"{x.field} {_short(x.old)} -> {_short(x.new)}" for x in c.changes))
    if table.row_count:
        _print_table(console, table)
    console.print(f"kernels: {len(d.added)} added, {len(d.removed)} removed, {len(d.changed)} changed, "
                  f"{len(set(k.id for k in o.kernels) & set(k.id for k in n.kernels)) - len(d.changed)} unchanged")
    for x in d.bundle:
        console.print(f"bundle: {x.field} {_short(x.old)} -> {_short(x.new)}")
    line = f"size: {_bytes(d.old.total_bytes)} -> {_bytes(d.new.total_bytes)} ({_signed(d.size_delta)} B)"
    if d.archive_delta is not None:
        line += (f"; wheel {_bytes(d.old.wheel.archive_bytes)} -> {_bytes(d.new.wheel.archive_bytes)} "
                 f"({_signed(d.archive_delta)} B)")
    console.print(line)


def _cubin_bytes(a: Artifact, kid: str) -> int:
    return a.manifest.kernel(kid).cubin.bytes


def _bundle_fields(a: Artifact) -> dict[str, object]:
    plain = a.manifest.plain()
    return {**_flatten(plain["bundle"], "bundle."), **_flatten(plain["toolchain"], "toolchain."),
            **_flatten(plain["provenance"], "provenance."),
            **{k: v for t in a.tables for k, v in _flatten(dict(t.table), f"tuning.{t.device}.table.").items()},
            "schema_version": plain["schema_version"]}


def _flatten(data: dict, prefix: str = "", ignore: tuple[str, ...] = ()) -> dict[str, object]:
    out: dict[str, object] = {}
    for key, value in data.items():
        if key in ignore:
            continue
        if isinstance(value, dict):
            out.update(_flatten(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = value
    return out


def _changes(old: dict[str, object], new: dict[str, object]) -> tuple[Change, ...]:
    return tuple(Change(f, old.get(f), new.get(f)) for f in sorted(old.keys() | new.keys()) if old.get(f) != new.get(f))


# -- output -------------------------------------------------------------------------------------

def print_size_breakdown(rows: tuple[SizeRow, ...], console: Console | None = None) -> None:
    """The per-kernel size table ``tilekiln package`` prints when a wheel is over its budget."""
    console = console or literal_console(stderr=True)
    table = Table(title="wheel size by part (largest first)", title_justify="left", box=box.SIMPLE_HEAD,
                  show_edge=False, pad_edge=False)
    for col in ("part", "files B", "in wheel B", "share"):
        table.add_column(col, justify="left" if col == "part" else "right")
    total = sum(r.wheel_bytes for r in rows) or 1
    for r in rows:
        table.add_row(r.part, f"{r.raw_bytes:,}", f"{r.wheel_bytes:,}", f"{100 * r.wheel_bytes / total:.1f}%")
    _print_table(console, table)
    console.print("a kernel's row is its source; its device code is inside the library, "
                  "`tilekiln inspect` lists each kernel's share (cubin B)")


def literal_console(**options) -> Console:
    """A console that prints text as it is. A bundle's strings (the device name a tuning file
    records, catalog file names, toolchain versions) may hold ``[bold]``, ``[link=...]`` or
    ``:warning:``, which rich would otherwise take for markup and emoji codes."""
    return Console(soft_wrap=True, markup=False, emoji=False, **options)


def _print_table(console: Console, table: Table) -> None:
    """Print at the table's natural width: kernel ids are never cut, piped or not."""
    natural = Measurement.get(console, console.options.update_width(10**5), table).maximum
    if natural > console.width:
        console = literal_console(file=console.file, width=natural, color_system=console.color_system,
                                  force_terminal=console.is_terminal)
    console.print(table)


def _short(value: object) -> object:
    """A sha256 as its first 12 hex digits, as in the provenance lines; anything else as it is."""
    if isinstance(value, str) and len(value) == 64 and all(c in "0123456789abcdef" for c in value):
        return value[:12]
    return value


def _bytes(n: int) -> str:
    return f"{n:,} B"


def _signed(n: int) -> str:
    return f"{n:+,}"
