"""What a build prints and how the CLI treats bad arguments and bad shard directories, without the DSL."""

from __future__ import annotations

import io
import json
import os
import threading
from pathlib import Path

import pytest
from click.testing import CliRunner
from rich.console import Console

from builder.cli.commands import main as cli
from builder.cli.progress import BuildProgress
from builder.cli.report import print_build_result, print_outcome
from builder.compile import parallel
from builder.compile.cubin import CubinInfo
from builder.compile.job import CompileFailure, CompileJob
from builder.compile.records import BuildRecord
from builder.compile.toolchain import ToolchainError
from builder.diagnostics import Diagnostic, DiagnosticError, Location
from builder.pipeline.build import BuildResult, BundleResult
from builder.pipeline.merge import _common_selection
from builder.pipeline.shard import SHARD_FILE, SHARD_SCHEMA, load_shards

LONG_ID = "gemm_sm90_bf16_bf16_f32_bf16_tn_128x256x64_c2x1"


def test_plain_progress_is_one_line_per_compile_with_eta(capsys):
    with BuildProgress("plain", total=5, label="building sm90a", cached=3) as progress:
        progress.advance("k1", "compiled", 1.0)
        progress.advance("k2", "failed", 0.5)
    lines = capsys.readouterr().err.splitlines()
    assert lines[0] == "building sm90a: 5 kernels, 3 cached, 2 to compile"
    assert lines[1].startswith("[4/5] compiled k1 (1.0s; failed 0; eta ")
    assert lines[2].startswith("[5/5] failed   k2 (0.5s; failed 1; eta 0s)")
    assert len(lines) == 3


def test_plain_progress_names_the_target_of_each_kernel(capsys):
    """One kernel id is compiled for several targets (sm100a, sm100f, ...): each line says which."""
    with BuildProgress("plain", total=2, label="building sm100a, sm100f") as progress:
        progress.advance("k1", "compiled", 1.0, "sm100a")
        progress.advance("k1", "failed", 0.5, "sm100f")
    lines = capsys.readouterr().err.splitlines()
    assert lines[1].startswith("[1/2] sm100a compiled k1 (1.0s; failed 0; eta ")
    assert lines[2].startswith("[2/2] sm100f failed   k1 (0.5s; failed 1; eta 0s)")


def test_rich_progress_runs_off_a_terminal_too(capsys):
    with BuildProgress("rich", total=3, label="building sm90a", cached=1) as progress:
        progress.advance("k1", "compiled", 1.0)
        progress.advance("k2", "failed", 0.5)
    err = capsys.readouterr().err
    assert "3/3" in err and "failed 1" in err


def test_default_workers_fit_cores_and_memory(monkeypatch):
    cores = len(os.sched_getaffinity(0))
    monkeypatch.setattr(parallel, "available_memory", lambda: 100 * 2**30)
    assert parallel.default_jobs() == cores
    monkeypatch.setattr(parallel, "available_memory", lambda: parallel.WORKER_MEMORY_BYTES * 3 // 2)
    assert parallel.default_jobs() == 1


def test_workers_that_cannot_start_fail_every_job_once(tmp_path, monkeypatch):
    """A DSL that does not import (here a stand-in that raises) fails each job with the reason, and returns."""
    fake = tmp_path / "site" / "cutlass"
    fake.mkdir(parents=True)
    (fake / "__init__.py").write_text("raise ImportError('no DSL in this environment')\n")
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    jobs = [CompileJob(f"k{i}", "sm_90a", "") for i in range(3)]
    results = list(parallel.LocalExecutor(2).run(jobs))
    assert sorted(r.kernel_id for r in results) == ["k0", "k1", "k2"]
    assert all(isinstance(r, CompileFailure) and "compile workers cannot start" in r.message for r in results)
    assert {r.rule for r in results} == {"COMPILE-NO-WORKERS"}


def test_a_build_of_more_jobs_than_its_workers_run_before_retiring_finishes(tmp_path, monkeypatch):
    """Workers retire after JOBS_PER_WORKER jobs, which CPython 3.11's pool never replaces while jobs
    are queued; every job still comes back (here a stand-in DSL fails each one at once)."""
    fake = tmp_path / "site" / "cutlass"
    fake.mkdir(parents=True)
    (fake / "__init__.py").write_text("")
    (fake / "cute.py").write_text("")
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    monkeypatch.setattr(parallel, "JOBS_PER_WORKER", 2)
    jobs = [CompileJob(f"k{i}", "sm_90a", "") for i in range(9)]
    results: list = []
    runner = threading.Thread(target=lambda: results.extend(parallel.LocalExecutor(2).run(jobs)), daemon=True)
    runner.start()
    runner.join(timeout=120)
    assert not runner.is_alive(), f"the pool hung after {len(results)} of 9 jobs"
    assert sorted(r.kernel_id for r in results) == [j.kernel_id for j in jobs]
    assert all(isinstance(r, CompileFailure) and r.rule == "COMPILE-FAILED" for r in results), results


def test_no_progress_prints_nothing(capsys):
    with BuildProgress("none", total=2, label="x") as progress:
        progress.advance("k", "compiled", 1.0)
    assert capsys.readouterr().err == ""


def test_the_table_is_not_cut_in_a_narrow_log(tmp_path):
    info = CubinInfo("sm_90a", 168, 0, 0, 0, (("HGMMA", 4),))
    records = (BuildRecord(LONG_ID, "sm_90a", "compiled", 1.23, cubin=b"x" * 100, info=info),
               BuildRecord(LONG_ID.replace("c2x1", "c1x1"), "sm_90a", "failed", 0.4,
                            error="RuntimeError: [bold]deliberate[/bold]\nsecond line\n" + "more\n" * 20))
    result = BuildResult((BundleResult("sm90a", "sm_90a", records, None, tmp_path / "r.json"),))
    out = io.StringIO()
    print_build_result(result, Console(file=out, width=80, soft_wrap=True))
    text = out.getvalue()
    assert LONG_ID in text and LONG_ID.replace("c2x1", "c1x1") in text
    assert "[bold]deliberate[/bold]" in text, "error text is printed literally, not as markup"
    assert "second line" in text and text.count("more") == 10, "the first lines of the error"
    assert "previous one is untouched" in text


def test_a_failed_kernel_shows_its_id_location_and_hint_and_reports_its_diagnostic(tmp_path):
    where = Location("catalog/gemm/sm90.yaml", 9, 5, "kernels[1]")
    problem = Diagnostic("COMPILE-SMEM-DRIFT", "the kernel uses 1 B, the model says 2", where, "fix the model",
                         facts={"arch": "sm_90a", "traced_bytes": 1, "model_bytes": 2}, subject=LONG_ID)
    failed = BuildRecord(LONG_ID, "sm_90a", "failed", 0.4, error=problem.message, diagnostic=problem)
    result = BuildResult((BundleResult("sm90a", "sm_90a", (failed,), None, tmp_path / "r.json"),))
    assert result.failures == (problem,)
    out = io.StringIO()
    print_build_result(result, Console(file=out, width=80, soft_wrap=True))
    text = out.getvalue()
    assert f"{LONG_ID} (sm_90a) COMPILE-SMEM-DRIFT at catalog/gemm/sm90.yaml:9:5" in text
    assert "hint: fix the model" in text
    row = failed.report()
    assert row["diagnostic"] == problem.to_json() and row["diagnostic"]["facts"]["traced_bytes"] == 1


@pytest.mark.parametrize("args, needle", [
    (["build", "--shard", "3/2"], "shard index must be within 1..2"),
    (["build", "--shard", "x"], "use I/N"),
    (["build", "--executor", "dask"], "unknown executor 'dask'"),
    (["build", "--progress", "fancy"], "Invalid value for '--progress'"),
])
def test_bad_build_arguments_are_usage_errors(args, needle, root):
    res = CliRunner().invoke(cli, ["--root", str(root), *args])
    assert res.exit_code == 2 and needle in res.output


def _shard(path: Path, index: int, count: int, only=(), bundle="sm90a") -> Path:
    path.mkdir(parents=True)
    (path / SHARD_FILE).write_text(json.dumps({
        "schema": SHARD_SCHEMA, "bundle": bundle, "arch": "sm_90a", "shard": [index, count],
        "selection": {"pipelines": [], "arches": [], "only": list(only)}, "kernels": []}))
    return path


def test_load_shards_finds_shards_below_a_directory_and_rejects_others(tmp_path):
    _shard(tmp_path / "shards" / "sm90a" / "1-of-2", 1, 2)
    _shard(tmp_path / "shards" / "sm90a" / "2-of-2", 2, 2)
    assert [s.index for s in load_shards([tmp_path / "shards"])] == [1, 2]
    (tmp_path / "empty").mkdir()
    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / SHARD_FILE).write_text("{not json")
    with pytest.raises(DiagnosticError) as exc:
        load_shards([tmp_path / "empty", broken])
    assert sorted(d.rule for d in exc.value.diagnostics) == ["SHARD-CORRUPT", "SHARD-MISSING"]


def test_shards_of_different_runs_do_not_merge(tmp_path):
    a = _shard(tmp_path / "a", 1, 2)
    b = _shard(tmp_path / "b", 2, 2, only=("*64x*",))
    with pytest.raises(DiagnosticError) as exc:
        _common_selection(load_shards([a, b]))
    assert [d.rule for d in exc.value.diagnostics] == ["SHARD-MIXED"]
    c = _shard(tmp_path / "c", 1, 3)
    d = _shard(tmp_path / "d", 1, 3)
    with pytest.raises(DiagnosticError) as exc:
        _common_selection(load_shards([c, d]))
    (problem,) = exc.value.diagnostics
    assert problem.rule == "SHARD-INCOMPLETE"
    assert "2/3, 3/3 missing" in problem.message and "shards 1 given twice" in problem.message


@pytest.mark.parametrize("command", [["list"], ["build", "--progress", "none"]])
def test_a_missing_toolchain_piece_is_a_usage_error_not_a_traceback(command, root, tmp_path, monkeypatch):
    def missing():
        raise ToolchainError("the build toolchain needs the nvidia-cutlass-dsl wheel")

    monkeypatch.setattr("builder.pipeline.build.compiler_fingerprint", missing)
    res = CliRunner().invoke(cli, ["--root", str(root), *command, "--cache", str(tmp_path)])
    assert res.exit_code == 2 and "needs the nvidia-cutlass-dsl wheel" in res.stderr
    assert res.exception is None or isinstance(res.exception, SystemExit)


def test_merge_of_a_missing_directory_is_a_usage_error(tmp_path, root):
    res = CliRunner().invoke(cli, ["--root", str(root), "merge", str(tmp_path / "nope")])
    assert res.exit_code == 2 and "does not exist" in res.output


def _outcome(result: BuildResult, seconds: float) -> list[str]:
    out = io.StringIO()
    print_outcome(result, seconds, Console(file=out, width=80, soft_wrap=True))
    return out.getvalue().splitlines()


def _bundle(tmp_path: Path, statuses: tuple[str, ...], unchanged: bool) -> BundleResult:
    info = CubinInfo("sm_90a", 168, 0, 0, 0, (("HGMMA", 4),))
    records = tuple(BuildRecord(f"{LONG_ID}_s{i + 2}", "sm_90a", status, 1.0, cubin=b"x", info=info,
                                 error="deliberate" if status == "failed" else "")
                    for i, status in enumerate(statuses))
    return BundleResult("sm90a", "sm_90a", records, tmp_path / "sm90a", tmp_path / "sm90a" / "r.json",
                        unchanged=unchanged)


def test_a_noop_build_is_one_line_with_its_wall_time(tmp_path):
    lines = _outcome(BuildResult((_bundle(tmp_path, ("cached",) * 94, unchanged=True),)), 0.4123)
    assert len(lines) == 1, lines
    assert lines[0].startswith("94 kernels, all cached;") and "sm90a unchanged" in lines[0]
    assert lines[0].endswith("; 0.41 s")


@pytest.mark.parametrize("statuses, unchanged", [
    (("cached", "compiled"), False),  # one kernel compiled
    (("cached", "cached"), False),  # all cached, but the bundle was (re)written, e.g. into a new --out
    (("cached", "failed"), True),  # --allow-partial with a failure: the table shows it
])
def test_a_build_that_did_something_prints_the_table_and_ends_with_its_wall_time(tmp_path, statuses, unchanged):
    lines = _outcome(BuildResult((_bundle(tmp_path, statuses, unchanged),)), 12.34)
    assert sum(LONG_ID in line and "│" in line for line in lines) == 2, "one table row per kernel"
    assert lines[-1].startswith("2 kernels: ") and lines[-1].endswith("; 12.3 s")
