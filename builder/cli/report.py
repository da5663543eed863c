"""Human-facing build output: the result table and the `list` view."""

from __future__ import annotations

from pathlib import Path

from rich.console import Console
from rich.markup import escape
from rich.measure import Measurement
from rich.table import Table

from builder.compile.cache import ContentCache
from builder.compile.records import BuildRecord
from builder.pipeline.build import BuildResult, BundleResult, Selection, plan, validated

COLUMNS = ("kernel", "status", "compile s", "regs", "spills", "smem B", "cubin B", "MMA")


def result_table(b: BundleResult) -> Table:
    where = f" shard {b.shard[0]}/{b.shard[1]}" if b.shard else ""
    table = Table(title=f"{b.bundle} ({b.arch}){where}", title_justify="left")
    for col in COLUMNS:
        table.add_column(col, justify="left" if col in ("kernel", "status") else "right", no_wrap=True)
    for r in b.records:
        table.add_row(*_row(r))
    return table


def _row(r: BuildRecord) -> tuple[str, ...]:
    info = r.info
    if info is None:
        return (r.kernel_id, r.status, f"{r.seconds:.1f}", "", "", "", "", "")
    mma = str(sum(n for op, n in info.census if "MMA" in op))
    return (r.kernel_id, r.status, f"{r.seconds:.1f}", str(info.registers), "yes" if info.spills else "no",
            "" if r.ctx is None else str(r.ctx.plan.smem.total), str(len(r.cubin)), mma)


def print_build_result(result: BuildResult, console: Console | None = None) -> None:
    console = console or Console(stderr=True, soft_wrap=True)
    for b in result.bundles:
        table = result_table(b)
        if not console.is_terminal:
            # A CI log has no width: print the table at its natural width
            # rather than rich's 80-column default, which cuts kernel ids.
            natural = Measurement.get(console, console.options.update_width(10_000), table).maximum
            console.width = max(console.width, natural)
        console.print(table)
        for r in b.failed:
            console.print(f"[red]failed[/red] {escape(_failure_head(r))}:\n  {escape(_indented(r.error_head))}",
                          highlight=False)
            if r.diagnostic is not None and r.diagnostic.hint:
                console.print(f"  hint: {escape(r.diagnostic.hint)}", highlight=False)
        console.print(f"{b.bundle}: {len(b.records) - len(b.failed)} ok, {len(b.failed)} failed; "
                      f"{_where(b)}; report {b.report_path}", highlight=False)


def _failure_head(r: BuildRecord) -> str:
    """``KERNEL (ARCH)``, then, when the record has its diagnostic, its id and catalog location."""
    head = f"{r.kernel_id} ({r.arch})"
    if r.diagnostic is not None:
        head += f" {r.diagnostic.rule} at {r.diagnostic.location}"
    return head


def _indented(text: str) -> str:
    return "\n  ".join(text.splitlines())


def print_outcome(result: BuildResult, seconds: float, console: Console | None = None) -> None:
    """What a build did, ending with its wall time ``seconds``: the tables, or, when it
    compiled nothing and left every bundle as it was, one line (a table of cached rows
    tells nothing the previous build did not)."""
    console = console or Console(stderr=True, soft_wrap=True)
    records = [r for b in result.bundles for r in b.records]
    if all(b.unchanged for b in result.bundles) and all(r.status == "cached" for r in records):
        names = ", ".join(b.bundle for b in result.bundles)
        where = result.bundles[0].path.parent
        console.print(f"{len(records)} kernels, all cached; bundle{'s' * (len(result.bundles) > 1)} {names} "
                      f"unchanged in {where}; {seconds:.2f} s", highlight=False)
        return
    print_build_result(result, console)
    count = {status: sum(r.status == status for r in records) for status in ("compiled", "cached", "failed")}
    console.print(f"{len(records)} kernels: {count['compiled']} compiled, {count['cached']} cached, "
                  f"{count['failed']} failed; {seconds:.1f} s", highlight=False)


def _where(b: BundleResult) -> str:
    if b.shard is not None:
        return f"shard {b.path}"
    if b.path is not None:
        return f"bundle {b.path}"
    if not any(r.ok for r in b.records):
        return "no bundle written (no kernel compiled)"
    return "no bundle written, the previous one is untouched (--allow-partial writes the kernels that passed)"


def list_planned(root: Path, cache_dir: Path, selection: Selection) -> list[dict]:
    """What a build with ``selection`` would do: each kernel, its target, cache key and whether it is cached."""
    cache = ContentCache(cache_dir)
    return [{"kernel": p.kernel_id, "arch": p.arch, "key": p.key, "cached": cache.get("kernel", p.key) is not None}
            for p in plan(validated(root), selection)]
