"""The build system on the two-kernel project: incremental, keep-going, crash-safe,
concurrent-safe, reproducible, sharded and on Ray.

Every test starts from copies of the session build (``small_build``: its
project, cache and bundle), so most rebuild nothing; ``bundle`` equality is
the sha256 of every file but ``build-report.json``.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from click.testing import CliRunner

import builder.pipeline.build as build_module
from builder.cli.commands import main as cli
from builder.compile.cache import ContentCache
from builder.compile.job import CompileOutput
from builder.compile.parallel import LocalExecutor
from builder.diagnostics import DiagnosticError
from builder.package.publish import tree_digests
from builder.pipeline.build import BuildRequest, Selection, build
from builder.pipeline.merge import merge
from builder.pipeline.reproduce import check_reproducible
from builder.pipeline.shard import SHARD_FILE, shard_dir

pytestmark = pytest.mark.compile

REPO = Path(__file__).resolve().parents[2]
SMALL_ID = "gemm_sm90_bf16_bf16_f32_bf16_tn_64x128x64_c1x2"
LARGE_ID = "gemm_sm90_bf16_bf16_f32_bf16_tn_128x128x64_c1x1"


@dataclass(frozen=True)
class Small:
    """The session build of tests/compile/conftest.py (``<base>/{project,artifacts,cache}``)."""

    project: Path
    cache: Path
    bundle: Path

    def digests(self) -> dict[str, str]:
        return tree_digests(self.bundle)


@pytest.fixture(scope="module")
def small(small_build) -> Small:
    base = small_build.path.parent.parent
    return Small(base / "project", base / "cache", small_build.path)


@dataclass
class CountingExecutor:
    """The local pool, remembering which kernels it was asked to compile."""

    inner: LocalExecutor = field(default_factory=lambda: LocalExecutor(2))
    compiled: list[str] = field(default_factory=list)
    name: str = "counting"

    def run(self, jobs, scratch=None):
        self.compiled.extend(j.kernel_id for j in jobs)
        yield from self.inner.run(jobs, scratch)


def copy_project(small: Small, dest: Path) -> Path:
    shutil.copytree(small.project, dest)
    return dest


def copy_cache(small: Small, dest: Path, keep=("kernel", "library")) -> Path:
    for kind in keep:
        shutil.copytree(small.cache / "v1" / kind, dest / "v1" / kind)
    return dest


def run(project: Path, out: Path, cache: Path, executor=None, **kwargs):
    return build(BuildRequest(root=project, out_dir=out, cache_dir=cache, executor=executor or CountingExecutor(),
                              progress="none", **kwargs))


def cli_process(project: Path, out: Path, cache: Path, *args: str, env: dict | None = None) -> subprocess.Popen:
    """``tilekiln build`` in its own process group (so a test can kill it and its workers)."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]), **(env or {}))
    cmd = [sys.executable, "-c", "from builder.cli.entry import main; main()", "--root", str(project), "build",
           "--out", str(out), "--cache", str(cache), *args]
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                            start_new_session=True)


def all_entries_valid(cache: Path) -> dict[str, int]:
    """Every cache entry on disk verifies; returns the count per kind."""
    counts = {}
    c = ContentCache(cache)
    for kind in ("kernel", "library"):
        entries = [d for d in (cache / "v1" / kind).glob("*/*") if d.is_dir()]
        for d in entries:
            assert c.get(kind, d.name) is not None, f"corrupt {kind} entry {d}"
        counts[kind] = len(entries)
    return counts


# -- incremental -------------------------------------------------------------------------------

def test_noop_rebuild_compiles_nothing_and_leaves_the_bundle_alone(small, tmp_path):
    out, cache = tmp_path / "out", copy_cache(small, tmp_path / "cache")
    first = run(small.project, out, cache)
    manifest = out / "sm90a" / "manifest.json"
    before = {p: (p.stat().st_ino, p.stat().st_mtime_ns) for p in (out / "sm90a").rglob("*")
              if p.name != "build-report.json"}
    executor = CountingExecutor()
    again = run(small.project, out, cache, executor)
    assert executor.compiled == []
    assert [r.status for r in again.bundles[0].records] == ["cached", "cached"]
    after = {p: (p.stat().st_ino, p.stat().st_mtime_ns) for p in (out / "sm90a").rglob("*")
             if p.name != "build-report.json"}
    assert after == before, "a no-op rebuild must not rewrite the bundle"
    assert first.ok and tree_digests(out / "sm90a") == small.digests()
    assert json.loads(manifest.read_text())["kernels"][0]["id"] == LARGE_ID


def test_verification_records_mark_exactly_the_cubins_they_ran(small, tmp_path):
    """A record of `tilekiln verify` makes a kernel hardware-verified only while its cubin is the
    one that ran; a record of another cubin under the same id leaves it compile-verified."""
    import tilekiln

    project = copy_project(small, tmp_path / "project")
    built = json.loads((small.bundle / "manifest.json").read_text())["kernels"]
    record = {"sku": "H100 80GB HBM3", "device": "NVIDIA H100 80GB HBM3", "compute_capability": [9, 0],
              "driver": "580.159.04", "torch": "2.11.0", "date": "2026-12-06", "seed": 1, "bundle_version": "0.1.0",
              "kernels": {built[0]["id"]: {"cubin_sha256": built[0]["cubin"]["sha256"], "max_rel_error": 0.003,
                                           "runs": 6},
                          built[1]["id"]: {"cubin_sha256": "0" * 64, "max_rel_error": 0.003, "runs": 6}},
              "failed": []}
    path = project / "catalog" / "verification" / "sm90a.json"
    path.parent.mkdir(parents=True, exist_ok=True)  # the copy holds the committed record, which this replaces
    path.write_text(json.dumps({"schema": 1, "bundle": "sm90a", "records": [record]}))
    executor = CountingExecutor()
    result = run(project, tmp_path / "out", copy_cache(small, tmp_path / "cache"), executor)
    assert result.ok and executor.compiled == []
    kernels = json.loads((tmp_path / "out" / "sm90a" / "manifest.json").read_text())["kernels"]
    assert [k["verification"] for k in kernels] == ["hardware-verified", "compile-verified"]
    assert kernels[0]["verified_on"] == [{"sku": "H100 80GB HBM3", "date": "2026-12-06", "driver": "580.159.04",
                                          "max_rel_error": 0.003}]
    loaded = tilekiln.load(tmp_path / "out" / "sm90a")
    assert [k.verification_label for k in loaded.kernels] == ["hardware-verified on H100 80GB HBM3",
                                                              "compile-verified"]
    path.write_text('{"schema": 1, "bundle": "sm90a", "records": [{"sku": "H100"}]}')
    with pytest.raises(DiagnosticError) as info:
        run(project, tmp_path / "out", tmp_path / "cache")
    assert {d.rule for d in info.value.diagnostics} == {"VERIFICATION-FILE"}
    assert {d.location.file for d in info.value.diagnostics} == {"catalog/verification/sm90a.json"}


def test_editing_one_config_recompiles_exactly_that_kernel(small, tmp_path):
    project = copy_project(small, tmp_path / "project")
    catalog = project / "catalog" / "gemm" / "sm90.yaml"
    catalog.write_text(catalog.read_text().replace("cluster: [1, 2]", "cluster: [2, 1]"))
    executor = CountingExecutor()
    result = run(project, tmp_path / "out", copy_cache(small, tmp_path / "cache"), executor)
    assert result.ok
    assert executor.compiled == ["gemm_sm90_bf16_bf16_f32_bf16_tn_64x128x64_c2x1"]
    assert {r.kernel_id: r.status for r in result.bundles[0].records} == {
        LARGE_ID: "cached", "gemm_sm90_bf16_bf16_f32_bf16_tn_64x128x64_c2x1": "compiled"}


def test_list_shows_what_is_cached_per_key_component(small, monkeypatch):
    runner = CliRunner()

    def cached(*args):
        res = runner.invoke(cli, ["--root", str(small.project), "list", "--cache", str(small.cache),
                                  "--format", "json", *args])
        assert res.exit_code == 0, res.output
        return {row["kernel"]: row["cached"] for row in json.loads(res.stdout)}

    assert cached() == {LARGE_ID: True, SMALL_ID: True}
    assert cached("--only", "*64x128*") == {SMALL_ID: True}
    assert cached("--pipeline", "sm90", "--arch", "sm_90a") == {LARGE_ID: True, SMALL_ID: True}
    assert cached("--shard", "1/2") == {LARGE_ID: True} and cached("--shard", "2/2") == {SMALL_ID: True}
    # Each toolchain component of the key: another compiler, inspector or host target is a miss.
    monkeypatch.setattr("builder.pipeline.build.compiler_fingerprint", lambda: "another-dsl")
    assert cached() == {LARGE_ID: False, SMALL_ID: False}
    monkeypatch.undo()
    monkeypatch.setattr("builder.pipeline.build.inspector_fingerprint", lambda: "another-cuobjdump")
    assert cached() == {LARGE_ID: False, SMALL_ID: False}
    monkeypatch.undo()
    monkeypatch.setattr("builder.compile.job.HOST_TARGET", "llvm -mtriple=aarch64-unknown-linux-gnu")
    assert cached() == {LARGE_ID: False, SMALL_ID: False}


def test_a_selection_that_matches_nothing_names_what_exists(small, tmp_path):
    with pytest.raises(DiagnosticError) as exc:
        run(small.project, tmp_path / "out", tmp_path / "cache", selection=Selection(arches=("sm_100a",)))
    (d,) = exc.value.diagnostics
    assert d.rule == "BUILD-EMPTY" and "sm_90a" in d.hint and "sm90" in d.hint


# -- keep going --------------------------------------------------------------------------------

def failing_project(small: Small, dest: Path) -> Path:
    """The small project with a template that raises for 64-row tiles only: the validator
    accepts the kernel, its compile fails, and the 128-row kernel renders exactly as before."""
    project = copy_project(small, dest)
    template = project / "templates" / "sm90_gemm.py.j2"
    text = template.read_text()
    anchor = "import cutlass\n"
    assert anchor in text
    template.write_text(text.replace(anchor, anchor + '{% if cfg.tile.m == 64 %}raise RuntimeError("deliberate failure: '
                                     'this template refuses 64-row tiles")\n{% endif %}', 1))
    return project


def test_a_failing_kernel_keeps_the_others_and_the_previous_bundle(small, tmp_path):
    project = failing_project(small, tmp_path / "project")
    out, cache = tmp_path / "out", copy_cache(small, tmp_path / "cache")
    shutil.copytree(small.bundle, out / "sm90a")
    previous = tree_digests(out / "sm90a")
    res = CliRunner().invoke(cli, ["--root", str(project), "build", "--out", str(out), "--cache", str(cache),
                                   "--progress", "plain"])
    assert res.exit_code == 1, res.output
    assert tree_digests(out / "sm90a") == previous, "without --allow-partial the previous bundle stays"
    report = json.loads((out / "sm90a.build-report.json").read_text())
    rows = {r["kernel"]: r for r in report["kernels"]}
    assert rows[SMALL_ID]["status"] == "failed" and "deliberate failure" in rows[SMALL_ID]["error"]
    assert rows[LARGE_ID]["status"] == "cached" and rows[LARGE_ID]["registers"] > 0
    assert {"compile_seconds", "spills", "smem_bytes", "cubin_bytes"} <= rows[LARGE_ID].keys()
    assert (report["passed"], report["failed"]) == (1, 1)
    assert SMALL_ID in res.stderr and "deliberate failure" in res.stderr  # the table and the error

    partial = run(project, out, cache, allow_partial=True)
    assert not partial.ok
    manifest = json.loads((out / "sm90a" / "manifest.json").read_text())
    assert [k["id"] for k in manifest["kernels"]] == [LARGE_ID]
    assert not (out / "sm90a" / f"sources/{SMALL_ID}.py.txt").exists()
    bundle_report = json.loads((out / "sm90a" / "build-report.json").read_text())
    assert {r["kernel"]: r["status"] for r in bundle_report["kernels"]} == {LARGE_ID: "cached", SMALL_ID: "failed"}
    assert not (out / "sm90a.build-report.json").exists(), "a stale failure report must go"


# The second kernel's catalog entry in SMALL_CATALOG (tests/compile/conftest.py): `  - tile: [64, 128, 64]`.
SMALL_AT = {"file": "catalog/gemm/sm90.yaml", "line": 9, "column": 5, "path": "kernels[1]"}


def test_a_failing_compile_is_a_diagnostic_with_its_id_in_the_report_json_and_github(small, tmp_path):
    project = failing_project(small, tmp_path / "project")
    out, cache = tmp_path / "out", copy_cache(small, tmp_path / "cache")
    args = ["--root", str(project), "build", "--out", str(out), "--cache", str(cache), "--progress", "none"]
    res = CliRunner().invoke(cli, [*args, "--format", "json"])
    assert res.exit_code == 1, res.output
    (d,) = json.loads(res.stdout)
    assert (d["rule"], d["subject"], d["location"]) == ("COMPILE-FAILED", SMALL_ID, SMALL_AT)
    assert d["facts"] == {"arch": "sm_90a", "exception": "RuntimeError"} and d["hint"]
    rows = {r["kernel"]: r for r in json.loads((out / "sm90a.build-report.json").read_text())["kernels"]}
    assert rows[SMALL_ID]["diagnostic"] == d and "diagnostic" not in rows[LARGE_ID]
    assert "COMPILE-FAILED at catalog/gemm/sm90.yaml:9:5" in res.stderr, "the table's failure line"

    res = CliRunner().invoke(cli, [*args, "--format", "github"])
    assert res.exit_code == 1, res.output
    (line,) = res.stdout.splitlines()
    assert line.startswith(f"::error file=catalog/gemm/sm90.yaml,line=9,col=5,title=COMPILE-FAILED ({SMALL_ID})::")


def test_a_compile_past_its_time_limit_fails_alone_with_its_id_and_partial_keeps_the_rest(small, tmp_path):
    """The small project with a template that hangs for 64-row tiles: --job-timeout kills that compile,
    the report names it at its catalog entry with the limit and the time it ran, and --allow-partial
    writes the bundle of the other kernel."""
    project = copy_project(small, tmp_path / "project")
    template = project / "templates" / "sm90_gemm.py.j2"
    template.write_text(template.read_text().replace(
        "import cutlass\n", "import cutlass\n{% if cfg.tile.m == 64 %}import time\ntime.sleep(600)\n{% endif %}", 1))
    out, cache = tmp_path / "out", copy_cache(small, tmp_path / "cache")
    args = ["--root", str(project), "build", "--out", str(out), "--cache", str(cache), "--progress", "none",
            "--format", "json", "--job-timeout", "2"]
    res = CliRunner().invoke(cli, args)
    assert res.exit_code == 1, res.output
    (d,) = json.loads(res.stdout)
    assert (d["rule"], d["subject"], d["location"]) == ("COMPILE-TIMEOUT", SMALL_ID, SMALL_AT)
    assert d["facts"]["arch"] == "sm_90a" and d["facts"]["limit_seconds"] == 2
    assert 2 <= d["facts"]["elapsed_seconds"] < 10
    rows = {r["kernel"]: r for r in json.loads((out / "sm90a.build-report.json").read_text())["kernels"]}
    assert rows[SMALL_ID]["diagnostic"] == d and rows[LARGE_ID]["status"] == "cached"
    assert not (out / "sm90a").exists(), "without --allow-partial no bundle is written"

    res = CliRunner().invoke(cli, [*args, "--allow-partial"])
    assert res.exit_code == 1, res.output
    manifest = json.loads((out / "sm90a" / "manifest.json").read_text())
    assert [k["id"] for k in manifest["kernels"]] == [LARGE_ID]


def test_a_corrupt_cache_entry_is_discarded_and_rebuilt(small, tmp_path):
    out, cache = tmp_path / "out", copy_cache(small, tmp_path / "cache")
    (planned,) = build_module.plan(build_module.validated(small.project), Selection(only=(SMALL_ID,)))
    entry = ContentCache(cache).get("kernel", planned.key)
    (entry.directory / "kernel.o").write_bytes(b"\0" * len(entry.read("kernel.o")))
    executor = CountingExecutor()
    assert run(small.project, out, cache, executor).ok
    assert executor.compiled == [SMALL_ID]
    assert tree_digests(out / "sm90a") == small.digests()
    assert len(list((cache / "quarantine").iterdir())) == 1
    assert all_entries_valid(cache) == {"kernel": 2, "library": 1}


def test_a_kernel_that_failed_in_its_shard_keeps_its_id_through_the_merge(small, tmp_path):
    project = failing_project(small, tmp_path / "project")
    out, cache = tmp_path / "out", copy_cache(small, tmp_path / "cache")
    for index in (1, 2):
        run(project, out, cache, selection=Selection(shard=(index, 2)))
    merged = merge(project, [out / "shards"], tmp_path / "merged", tmp_path / "merge-cache", progress="none")
    (d,) = merged.failures
    assert (d.rule, d.subject, d.location.line, d.location.path) == ("COMPILE-FAILED", SMALL_ID, 9, "kernels[1]")
    assert d.facts == {"arch": "sm_90a", "exception": "RuntimeError"}


@pytest.fixture(scope="module")
def small_output(small) -> CompileOutput:
    """SMALL_ID compiled once for sm_90a; the drift tests hand back altered copies of it."""
    (planned,) = build_module.plan(build_module.validated(small.project), Selection(only=(SMALL_ID,)))
    (result,) = LocalExecutor(1).run([planned.job])
    assert isinstance(result, CompileOutput), result
    return result


@dataclass
class Replay:
    """An executor that compiles nothing: it returns ``output`` with the fields in ``changes``."""

    output: CompileOutput
    changes: dict
    name: str = "replay"

    def run(self, jobs, scratch=None):
        for job in jobs:
            assert (job.kernel_id, job.arch) == (self.output.kernel_id, self.output.arch)
            yield dataclasses.replace(self.output, **self.changes)


@pytest.mark.parametrize("drift", ["smem", "arch", "toolchain"])
def test_an_object_that_is_not_what_the_build_asked_for_fails_with_its_id(drift, small, small_output, tmp_path,
                                                                          monkeypatch):
    """The checks after a compile (builder/pipeline/build.py: _drift), forced: the traced shared memory off the
    validator's model by 1 KiB, a cubin that records sm_90 for sm_90a, another worker toolchain."""
    changes, facts = {}, {"arch": "sm_90a"}
    if drift == "smem":
        rule = "COMPILE-SMEM-DRIFT"
        changes["traced_smem_bytes"] = small_output.traced_smem_bytes + 1024
        facts |= {"traced_bytes": small_output.traced_smem_bytes + 1024, "model_bytes": small_output.traced_smem_bytes,
                  "static_bytes": small_output.info.static_smem_bytes,
                  "model_static_bytes": small_output.info.static_smem_bytes}
    elif drift == "arch":
        rule = "COMPILE-ARCH-DRIFT"
        monkeypatch.setattr("builder.pipeline.build.compiled_for", lambda cubin: "sm_90")
        facts |= {"requested_arch": "sm_90a", "cubin_arch": "sm_90"}
    else:
        rule = "TOOLCHAIN-MISMATCH"
        changes["toolchain"] = ("another-dsl", "another-cuobjdump")
        facts |= {"worker_toolchain": ["another-dsl", "another-cuobjdump"],
                  "build_toolchain": [build_module.compiler_fingerprint(), build_module.inspector_fingerprint()]}
    monkeypatch.setattr("builder.compile.parallel.make_executor",
                        lambda spec, jobs, limits: Replay(small_output, changes))
    out, cache = tmp_path / "out", tmp_path / "cache"
    res = CliRunner().invoke(cli, ["--root", str(small.project), "build", "--out", str(out), "--cache", str(cache),
                                   "--only", SMALL_ID, "--progress", "none", "--format", "json"])
    assert res.exit_code == 1, res.output
    (d,) = json.loads(res.stdout)
    assert (d["rule"], d["subject"], d["location"]) == (rule, SMALL_ID, SMALL_AT)
    assert d["facts"] == facts
    (row,) = json.loads((out / "sm90a.build-report.json").read_text())["kernels"]
    assert row["status"] == "failed" and row["diagnostic"] == d
    assert all_entries_valid(cache)["kernel"] == 0, "an object that failed a check is never cached"


def test_a_library_that_needs_a_newer_glibc_than_the_catalog_targets_fails_the_build(small, tmp_path, monkeypatch):
    """The link made to bind to glibc 2.34's symbol versions, as Debian 12's gcc did: the build
    stops at catalog.yaml's glibc line, naming symbols, and writes no bundle."""
    monkeypatch.setattr("builder.package.link.zig_target", lambda glibc: "x86_64-linux-gnu.2.34")
    out, cache = tmp_path / "out", copy_cache(small, tmp_path / "cache", keep=("kernel",))
    res = CliRunner().invoke(cli, ["--root", str(small.project), "build", "--out", str(out), "--cache", str(cache),
                                   "--progress", "none"])
    assert res.exit_code == 1, res.output
    lines = (small.project / "catalog" / "catalog.yaml").read_text().splitlines()
    line = next(i for i, text in enumerate(lines, start=1) if text.startswith("glibc:"))
    assert f"catalog/catalog.yaml:{line}:" in res.stderr and "GLIBC-TARGET" in res.stderr
    assert "libtilekiln_sm90a.so needs glibc 2.34" in res.stderr and "@GLIBC_2.34" in res.stderr
    assert not (out / "sm90a").exists()


def test_the_ci_table_shows_whole_kernel_ids(small, tmp_path):
    res = CliRunner().invoke(cli, ["--root", str(small.project), "build", "--out", str(tmp_path / "out"),
                                   "--cache", str(copy_cache(small, tmp_path / "cache")), "--progress", "plain"])
    assert res.exit_code == 0, res.output
    assert "building sm90a: 2 kernels, 2 cached, 0 to compile" in res.stderr
    table_rows = [line for line in res.stderr.splitlines() if "cached" in line and "│" in line]
    assert len(table_rows) == 2 and any(LARGE_ID in line for line in table_rows), res.stderr


def test_a_noop_rebuild_prints_one_line_instead_of_the_table(small, tmp_path):
    args = ["--root", str(small.project), "build", "--out", str(tmp_path / "out"),
            "--cache", str(copy_cache(small, tmp_path / "cache")), "--progress", "plain"]
    first, again = CliRunner().invoke(cli, args), CliRunner().invoke(cli, args)
    assert first.exit_code == again.exit_code == 0, first.output + again.output
    assert "│" in first.stderr, "the first build writes the bundle: its table"
    assert re.search(r"\n2 kernels: 0 compiled, 2 cached, 0 failed; [0-9.]+ s\n$", first.stderr), first.stderr
    assert "│" not in again.stderr
    assert re.search(r"\n2 kernels, all cached; bundle sm90a unchanged in .*; [0-9.]+ s\n$", again.stderr), again.stderr


# -- crash safety and concurrency --------------------------------------------------------------

def _wait_for_line(proc: subprocess.Popen, needle: str, timeout: float = 120.0) -> list[str]:
    seen, deadline = [], time.monotonic() + timeout
    while time.monotonic() < deadline:
        line = proc.stderr.readline()
        if not line and proc.poll() is not None:
            break
        seen.append(line)
        if needle in line:
            return seen
    raise AssertionError(f"never saw {needle!r}: {''.join(seen)}")


def _group_runs(pgid: int, needles: tuple[str, ...]) -> bool:
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
            if int(fields[2]) != pgid:
                continue
            cmdline = (stat.parent / "cmdline").read_bytes().replace(b"\0", b" ").decode()
        except (OSError, IndexError, ValueError):
            continue
        if any(n in cmdline for n in needles):
            return True
    return False


def test_kill_9_during_compile_then_rerun_finishes_from_the_cache(small, tmp_path):
    out, cache = tmp_path / "out", tmp_path / "cache"
    proc = cli_process(small.project, out, cache, "-j", "1", "--progress", "plain")
    try:
        _wait_for_line(proc, "[1/2] sm90a compiled")
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    assert not (out / "sm90a").exists()
    assert all_entries_valid(cache) == {"kernel": 1, "library": 0}
    executor = CountingExecutor()
    result = run(small.project, out, cache, executor)
    assert result.ok and len(executor.compiled) == 1
    assert tree_digests(out / "sm90a") == small.digests()
    assert not list((cache / "tmp").iterdir()), "the rerun sweeps what the killed build left"


def test_kill_9_during_link_then_rerun(small, tmp_path):
    out, cache = tmp_path / "out", copy_cache(small, tmp_path / "cache", keep=("kernel",))
    proc = cli_process(small.project, out, cache, "--progress", "none")
    deadline = time.monotonic() + 120
    while not _group_runs(proc.pid, ("glue.c", "lib.so")):
        assert proc.poll() is None and time.monotonic() < deadline, "the build ended before it linked"
        time.sleep(0.002)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    assert not (out / "sm90a").exists()
    assert all_entries_valid(cache) == {"kernel": 2, "library": 0}
    executor = CountingExecutor()
    assert run(small.project, out, cache, executor).ok and executor.compiled == []
    assert tree_digests(out / "sm90a") == small.digests()
    assert not list((cache / "tmp").iterdir())


def test_kill_9_at_many_moments_never_leaves_a_partial_bundle(small, tmp_path):
    """Kills spread over a build that links and publishes (start-up, link, swap): after each,
    the bundle is absent or complete, every cache entry verifies, and the next build finishes."""
    out, cache = tmp_path / "out", copy_cache(small, tmp_path / "cache", keep=("kernel",))
    for delay in (0.3, 0.45, 0.6, 0.75, 0.9, 1.2):
        proc = cli_process(small.project, out, cache, "--progress", "none")
        time.sleep(delay)
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        if (out / "sm90a").exists():
            assert tree_digests(out / "sm90a") == small.digests(), f"partial bundle after a kill at {delay}s"
        all_entries_valid(cache)
        shutil.rmtree(out / "sm90a", ignore_errors=True)
        for entry in (cache / "v1" / "library").glob("*/*"):
            shutil.rmtree(entry)
    assert run(small.project, out, cache).ok
    assert tree_digests(out / "sm90a") == small.digests()
    assert [p.name for p in out.iterdir() if p.name.startswith(".") and p.name != ".locks"] == []


def _compiled(stderr: str) -> int:
    """How many kernels a ``tilekiln build`` compiled, from its closing line."""
    if re.search(r"^\d+ kernels, all cached;", stderr, re.M):
        return 0
    return int(re.search(r"^\d+ kernels: (\d+) compiled,", stderr, re.M).group(1))


def test_three_builds_sharing_cache_and_output_compile_each_kernel_once(small, tmp_path):
    out, cache = tmp_path / "out", tmp_path / "cache"
    procs = [cli_process(small.project, out, cache, "-j", "1", "--progress", "none") for _ in range(3)]
    compiled = 0
    for p in procs:
        _, err = p.communicate(timeout=300)
        assert p.returncode == 0, err
        compiled += _compiled(err)
    assert compiled == 2, "each of the two kernels is compiled by one build; the others wait for its entry"
    assert tree_digests(out / "sm90a") == small.digests()
    assert all_entries_valid(cache) == {"kernel": 2, "library": 1}
    assert not list((cache / "tmp").iterdir())
    assert sorted(p.name for p in out.iterdir()) == [".locks", "sm90a"]


def _live_group(pgid: int) -> list[str]:
    """Command lines of the processes of group ``pgid`` that are not zombies."""
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
            if int(fields[2]) == pgid and fields[0] != "Z":
                found.append((stat.parent / "cmdline").read_bytes().replace(b"\0", b" ").decode())
        except (OSError, IndexError, ValueError):
            continue
    return found


def test_workers_of_a_build_killed_with_sigkill_exit_and_its_temporary_files_are_swept(small, tmp_path):
    """SIGKILL to the build process alone (not its group): its compile workers exit at once, and
    everything it had in flight lies under the cache's tmp/, which the next build empties. The
    template hangs for 64-row tiles, so the build is still compiling whenever the kill comes (a
    fast machine had finished it, scratch swept, before a fixed delay ran out)."""
    project = copy_project(small, tmp_path / "project")
    template = project / "templates" / "sm90_gemm.py.j2"
    template.write_text(template.read_text().replace(
        "import cutlass\n", "import cutlass\n{% if cfg.tile.m == 64 %}import time\ntime.sleep(600)\n{% endif %}", 1))
    out, cache, temp = tmp_path / "out", tmp_path / "cache", tmp_path / "system-tmp"
    temp.mkdir()
    proc = cli_process(project, out, cache, "-j", "2", "--progress", "plain", env={"TMPDIR": str(temp)})
    try:
        deadline = time.monotonic() + 120
        while sum("spawn_main" in c for c in _live_group(proc.pid)) < 2:
            assert proc.poll() is None and time.monotonic() < deadline, "the build never started its workers"
            time.sleep(0.05)
        time.sleep(1.5)  # into the DSL import or the compiles
    finally:
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
    deadline = time.monotonic() + 10
    while _live_group(proc.pid) and time.monotonic() < deadline:
        time.sleep(0.1)
    survivors = _live_group(proc.pid)
    if survivors:
        os.killpg(proc.pid, signal.SIGKILL)
    assert survivors == [], "a worker outlived its build"
    assert proc.returncode == -signal.SIGKILL, "the build ended before the kill"
    assert list((cache / "tmp").iterdir()), "the killed build's scratch is left in the cache's tmp/"
    assert list(temp.iterdir()) == [], "nothing of the killed build is left in the system's temporary directory"
    assert run(small.project, out, cache).ok
    assert not list((cache / "tmp").iterdir()), "the next build sweeps it"


# -- reproducibility, shards, Ray --------------------------------------------------------------

def test_check_reproducible_rebuilds_from_nothing_and_matches(small, tmp_path):
    res = CliRunner().invoke(cli, ["--root", str(small.project), "build", "--out", str(tmp_path / "out"),
                                   "--cache", str(copy_cache(small, tmp_path / "cache")), "--progress", "none",
                                   "--check-reproducible"])
    assert res.exit_code == 0, res.output
    files = len(small.digests())
    assert f"reproducible: {files} files identical in a clean rebuild" in res.stderr


def test_check_reproducible_names_a_file_that_differs(small, tmp_path, monkeypatch):
    out, cache = tmp_path / "out", copy_cache(small, tmp_path / "cache")
    request = BuildRequest(root=small.project, out_dir=out, cache_dir=cache, executor=CountingExecutor(),
                           progress="none")
    first = build(request)
    # The clean rebuild gets a source that differs in one comment: only that kernel's files may differ.
    real = build_module.render_kernel

    def render(ctx):
        source = real(ctx)
        if ctx.entry.kernel_id != SMALL_ID:
            return source
        return type(source)(source.kernel_id, source.text + "# a build-time difference\n", source.template_sha256)

    monkeypatch.setattr("builder.pipeline.build.render_kernel", render)
    check = check_reproducible(request, first)
    named = {d.location.file for d in check.diagnostics}
    assert not check.ok and f"sm90a/sources/{SMALL_ID}.py.txt" in named
    assert "sm90a/manifest.json" in named and f"sm90a/sources/{LARGE_ID}.py.txt" not in named


def test_shards_merge_into_the_single_machine_bundle(small, tmp_path):
    out, cache = tmp_path / "out", copy_cache(small, tmp_path / "cache")
    for index in (1, 2):
        result = run(small.project, out, cache, selection=Selection(shard=(index, 2)))
        assert result.ok and len(result.bundles[0].records) == 1
    first = shard_dir(out, "sm90a", 1, 2)
    description = json.loads((first / SHARD_FILE).read_text())
    assert [k["id"] for k in description["kernels"]] == [LARGE_ID]
    again = run(small.project, tmp_path / "again", cache, selection=Selection(shard=(1, 2)))
    assert tree_digests(again.bundles[0].path) == tree_digests(first), "a shard is reproducible"

    with pytest.raises(DiagnosticError) as exc:
        merge(small.project, [first], tmp_path / "merged", tmp_path / "merge-cache", progress="none")
    assert [d.rule for d in exc.value.diagnostics] == ["SHARD-INCOMPLETE"]
    assert "2/2 missing" in exc.value.diagnostics[0].message

    # A fresh cache: every object must come from the shards.
    merged = merge(small.project, [out / "shards"], tmp_path / "merged", tmp_path / "merge-cache", progress="none")
    assert merged.ok
    assert tree_digests(tmp_path / "merged" / "sm90a") == small.digests()


def test_merge_refuses_shards_of_another_catalog(small, tmp_path):
    out, cache = tmp_path / "out", copy_cache(small, tmp_path / "cache")
    for index in (1, 2):
        run(small.project, out, cache, selection=Selection(shard=(index, 2)))
    project = copy_project(small, tmp_path / "project")
    catalog = project / "catalog" / "gemm" / "sm90.yaml"
    catalog.write_text(catalog.read_text().replace("cluster: [1, 2]", "cluster: [2, 1]"))
    res = CliRunner().invoke(cli, ["--root", str(project), "merge", str(out / "shards"), "--out",
                                   str(tmp_path / "merged"), "--cache", str(tmp_path / "c")])
    assert res.exit_code == 1
    assert res.stderr.count("SHARD-CATALOG") == 2 and "in no shard" in res.stderr
    assert not (tmp_path / "merged" / "sm90a").exists()


def test_ray_executor_builds_the_same_bundle(small, tmp_path, monkeypatch):
    ray = pytest.importorskip("ray", reason="Ray is not installed (pip install 'tilekiln-build[ray]')")
    from builder.compile.parallel import RayExecutor

    # ray.init writes ~/.ray/auth_token; a test keeps out of the user's home.
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:
        result = run(small.project, tmp_path / "out", tmp_path / "cache", RayExecutor(None))
    finally:
        ray.shutdown()
    assert result.ok, [r.error for r in result.bundles[0].failed]
    assert [r.status for r in result.bundles[0].records] == ["compiled", "compiled"]
    assert tree_digests(tmp_path / "out" / "sm90a") == small.digests()
