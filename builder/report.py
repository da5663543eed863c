"""Human-facing build output: the result table and the `list` view."""

from __future__ import annotations

from pathlib import Path

from rich.console import Console
from rich.table import Table

from builder.build import BuildResult, Selection, object_key
from builder.cache import ContentCache
from builder.compile import CompileJob
from builder.diagnostics import DiagnosticError
from builder.render import render_kernel
from builder.validate import Project, validate_project


def print_build_result(result: BuildResult, console: Console | None = None) -> None:
    console = console or Console(stderr=True, soft_wrap=True)
    for b in result.bundles:
        table = Table(title=f"{b.bundle} ({b.arch})", title_justify="left")
        for col in ("kernel", "status", "compile s", "regs", "spills", "smem B", "cubin B", "MMA"):
            table.add_column(col, justify="left" if col in ("kernel", "status") else "right")
        for r in b.records:
            info = r.info
            mma = "" if info is None else str(sum(n for op, n in info.census if "MMA" in op))
            table.add_row(r.kernel_id, r.status, f"{r.seconds:.1f}",
                          "" if info is None else str(info.registers),
                          "" if info is None else ("yes" if info.spills else "no"),
                          "" if r.ctx is None else str(r.ctx.plan.smem.total),
                          str(len(r.cubin)) if r.cubin else "", mma)
        console.print(table)
        for r in b.failed:
            console.print(f"[red]failed[/red] {r.kernel_id} ({r.arch}):\n  " +
                          "\n  ".join(r.error.strip().splitlines()[:12]))
        where = f"bundle {b.path}" if b.path else "no bundle written (a kernel failed; --allow-partial keeps the rest)"
        console.print(f"{b.bundle}: {len(b.records) - len(b.failed)} ok, {len(b.failed)} failed; {where}; "
                      f"report {b.report_path}")


def list_planned(root: Path, cache_dir: Path, selection: Selection) -> list[dict]:
    validation = validate_project(Project(root))
    if not validation.ok:
        raise DiagnosticError([d for d in validation.diagnostics if d.severity.value == "error"])
    cache = ContentCache(cache_dir)
    rows = []
    for arch, ctx in selection.planned(validation):
        job = CompileJob(ctx.entry.kernel_id, arch, render_kernel(ctx).text)
        rows.append({"kernel": ctx.entry.kernel_id, "arch": arch,
                     "cached": cache.get("kernel", object_key(job)) is not None})
    return rows
