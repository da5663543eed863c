"""Fault injection: builds killed with SIGKILL at random moments, and concurrent builds, counted.

Method: a fixed 4-kernel sm90 catalog (2 tiles x 2 clusters) is written into a
temporary project copied from this checkout's templates and facts. Every
build is the real command line (``tilekiln build -j 2 --progress plain``, a
fresh process in its own process group, its ``TMPDIR`` a private directory),
on one cache and one output directory for the whole run.

* Kill trials (``--kills``): before each, a random subset of the cache's
  kernel entries (each with probability 3/4) and every library entry are removed, so kills land in
  start-up, the compiles, the link and the publish alike. The build gets
  SIGKILL at a uniformly random moment within 1.1x a cold build's measured
  wall time; only the build process is killed, its workers must exit by
  themselves. Then the checks below, and the resume: the same build, not
  killed, which must exit 0 and compile exactly the kernels the cache lacked
  when it started.
* Concurrent rounds (``--rounds``, 2, 3, 4, 2, ... builds): the cache's kernel
  and library entries are removed and the builds start together on the one
  cache and output; in every other round one of them is killed at a random
  moment (and one more build then sweeps what it left). Every other build
  must exit 0 within ``--hang-seconds``.

Each kill records what ran at that moment: compile workers
(``kills_while_compiling``) and the linker (``kills_while_linking``). Checked
after every kill, resume and round: processes of a killed build still
alive 5 s after the kill (``orphans``, then killed); every cache entry verifies
(``meta.json``'s key and every file's sha256; a corrupt entry, or one a build
found corrupt and quarantined, is ``corrupt_cache_entries``); the bundle is
absent or holds exactly the catalog's kernels and verifies file by file
against its manifest (``bad_bundles``). After each resume and round: nothing
left in ``<cache>/tmp`` or in the builds' ``TMPDIR`` (``leftover_temp``), and
no staging directory beside the bundle. Compiles are counted from the builds'
``compiled`` progress lines, each printed once the object is in the cache:
``recompiled_cached`` (a resume compiling a kernel cached when it started)
and ``duplicate_compiles`` (a kernel compiled by more than one build of a
round) must be 0.

    .venv/bin/python bench/faults.py --json bench/results/faults-cpu-$(date +%F).json
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import random
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from builder.compile.cache import ContentCache  # noqa: E402
from builder.package.artifact import open_artifact  # noqa: E402
from builder.pipeline.build import Selection, plan, validated  # noqa: E402
from project import scratch_project  # noqa: E402  (bench/project.py, beside this script)

TILES = ([128, 128, 64], [64, 128, 64])
CLUSTERS = ([1, 1], [2, 1])
BUNDLE = "sm90a"
COMPILED = re.compile(r"^\[\d+/\d+\] \S+ compiled +(\S+) ", re.M)


def catalog_text() -> str:
    lines = ["pipeline: sm90", "targets: [sm_90a]", "defaults:", "  dtypes: {a: bf16, b: bf16, acc: f32, c: bf16}",
             "  layout: tn", "kernels:"]
    for tile in TILES:
        for cluster in CLUSTERS:
            lines += [f"  - tile: {tile}", f"    cluster: {cluster}"]
    return "\n".join(lines) + "\n"


class Campaign:
    def __init__(self, base: Path, rng: random.Random):
        self.project = scratch_project(base / "project", catalog_text())
        self.out, self.cache, self.temp = base / "out", base / "cache", base / "tmp"
        self.temp.mkdir()
        self.rng = rng
        self.keys = {p.kernel_id: p.key for p in plan(validated(self.project), Selection())}
        self.counts = Counter()

    def start(self) -> subprocess.Popen:
        env = dict(os.environ, PYTHONPATH=str(ROOT), TMPDIR=str(self.temp))
        cmd = [sys.executable, "-c", "from builder.cli.entry import main; main()", "--root", str(self.project),
               "build", "--out", str(self.out), "--cache", str(self.cache), "-j", "2", "--progress", "plain"]
        return subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=env,
                                start_new_session=True)

    def kill(self, proc: subprocess.Popen) -> tuple[str, dict[str, int]]:
        """SIGKILL to the build process alone; count its processes alive 5 s later (and end them).
        Returns its stderr and what ran at the kill: compile workers, and the linker (zig)."""
        running = [cmdline(pid) for pid in live_group(proc.pid)]
        at_kill = {"workers": sum("spawn_main" in c for c in running), "linking": sum("zig" in c for c in running)}
        self.counts["kills_while_compiling"] += at_kill["workers"] > 0
        self.counts["kills_while_linking"] += at_kill["linking"] > 0
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
        deadline = time.monotonic() + 5
        while live_group(proc.pid) and time.monotonic() < deadline:
            time.sleep(0.05)
        left = live_group(proc.pid)
        self.counts["orphans"] += len(left)
        if left:
            os.killpg(proc.pid, signal.SIGKILL)
        # Only now: a surviving worker holds the build's stderr open.
        return proc.communicate()[1], at_kill

    def cached(self) -> set[str]:
        return {k for k, key in self.keys.items() if (self.cache / "v1" / "kernel" / key[:2] / key).exists()}

    def forget(self, kernels: set[str]) -> None:
        for k in kernels:
            shutil.rmtree(self.cache / "v1" / "kernel" / self.keys[k][:2] / self.keys[k], ignore_errors=True)
        shutil.rmtree(self.cache / "v1" / "library", ignore_errors=True)

    def check(self) -> None:
        """Every cache entry verifies, the bundle is absent or complete and verified."""
        cache = ContentCache(self.cache)
        for kind in ("kernel", "library"):
            for entry in (self.cache / "v1" / kind).glob("*/*"):
                cache.get(kind, entry.name)  # a corrupt entry is quarantined, and counted from there
        quarantine = self.cache / "quarantine"
        self.counts["corrupt_cache_entries"] = len(list(quarantine.iterdir())) if quarantine.exists() else 0
        bundle = self.out / BUNDLE
        if bundle.exists():
            found = open_artifact(bundle)
            if found.problem or sorted(k.id for k in found.manifest.kernels) != sorted(self.keys):
                self.counts["bad_bundles"] += 1

    def check_clean(self) -> None:
        leftovers = list((self.cache / "tmp").iterdir()) + list(self.temp.iterdir())
        leftovers += [p for p in self.out.iterdir() if p.name.startswith((".staging-", ".old-"))]
        self.counts["leftover_temp"] += len(leftovers)
        for path in leftovers:
            shutil.rmtree(path, ignore_errors=True) if path.is_dir() else path.unlink(missing_ok=True)

    def finish(self, proc: subprocess.Popen, timeout: float) -> tuple[int | None, str]:
        try:
            _, err = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            _, err = proc.communicate()
            return None, err
        return proc.returncode, err


def cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError:
        return ""


def live_group(pgid: int) -> list[int]:
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[2]) == pgid and fields[0] != "Z":
            found.append(int(stat.parent.name))
    return found


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--kills", type=int, default=24, help="kill trials, each followed by a resume")
    p.add_argument("--rounds", type=int, default=4, help="concurrent rounds (2, 3, 4, 2, ... builds)")
    p.add_argument("--hang-seconds", type=float, default=300, help="a build running longer counts as hung")
    p.add_argument("--seed", type=int, default=35)
    p.add_argument("--json", type=Path, default=None)
    args = p.parse_args()
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="tilekiln-faults-") as tmp:
        c = Campaign(Path(tmp), random.Random(args.seed))
        t0 = time.monotonic()
        rc, err = c.finish(c.start(), args.hang_seconds)
        cold = time.monotonic() - t0
        assert rc == 0 and len(COMPILED.findall(err)) == len(c.keys), err
        print(f"cold build: {cold:.1f} s, {len(c.keys)} kernels", flush=True)
        trials = []
        for trial in range(args.kills):
            forgotten = {k for k in c.keys if c.rng.random() < 0.75}
            c.forget(forgotten)
            delay = c.rng.uniform(0, 1.1 * cold)
            proc = c.start()
            time.sleep(delay)
            killed_err, at_kill = c.kill(proc)
            c.check()
            before = c.cached()
            rc, err = c.finish(c.start(), args.hang_seconds)
            compiled = COMPILED.findall(err)
            c.counts["resumes"] += 1
            c.counts["failed_resumes"] += rc != 0
            c.counts["recompiled_cached"] += len(set(compiled) & before)
            c.counts["missing_not_compiled"] += len(set(c.keys) - before - set(compiled))
            c.check()
            c.check_clean()
            trials.append({"kill_after_seconds": round(delay, 2), "removed_before": len(forgotten), **at_kill,
                           "compiled_before_kill": len(COMPILED.findall(killed_err)),
                           "cached_at_resume": len(before), "resume_compiled": len(compiled), "resume_rc": rc})
            print(f"kill {trial + 1}/{args.kills} at {delay:.1f} s ({len(forgotten)} removed, "
                  f"{len(COMPILED.findall(killed_err))} compiled before the kill): resume compiled {len(compiled)}, "
                  f"{len(before)} were cached; {dict(c.counts)}", flush=True)
        rounds = []
        for r in range(args.rounds):
            builds = 2 + r % 3
            victim = c.rng.randrange(builds) if r % 2 else None
            c.forget(set(c.keys))
            procs = [c.start() for _ in range(builds)]
            outputs, rcs = [], []
            if victim is not None:
                time.sleep(c.rng.uniform(0, cold))
                outputs.append(c.kill(procs[victim])[0])
            t0 = time.monotonic()
            for i, proc in enumerate(procs):
                if i != victim:
                    rc, err = c.finish(proc, max(1.0, args.hang_seconds - (time.monotonic() - t0)))
                    outputs.append(err)
                    rcs.append(rc)
            c.counts["hung_builds"] += sum(rc is None for rc in rcs)
            c.counts["failed_builds"] += sum(rc not in (0, None) for rc in rcs)
            per_kernel = Counter(k for err in outputs for k in COMPILED.findall(err))
            duplicates = sum(n - 1 for n in per_kernel.values())
            c.counts["duplicate_compiles"] += duplicates
            c.counts["concurrent_builds"] += builds
            c.check()
            if victim is not None:
                # The others started while the killed one lived: the next build sweeps what it left.
                c.finish(c.start(), args.hang_seconds)
            c.check_clean()
            rounds.append({"builds": builds, "killed": victim is not None, "compiles": sum(per_kernel.values()),
                           "duplicates": duplicates, "exit_codes": rcs})
            print(f"round {r + 1}/{args.rounds}: {builds} builds{', one killed' if victim is not None else ''}: "
                  f"{sum(per_kernel.values())} compiles of {len(c.keys)} kernels; {dict(c.counts)}", flush=True)
    counts = {name: c.counts[name] for name in (
        "kills_while_compiling", "kills_while_linking", "resumes", "corrupt_cache_entries", "bad_bundles", "orphans",
        "leftover_temp", "recompiled_cached", "missing_not_compiled", "failed_resumes", "concurrent_builds",
        "duplicate_compiles", "hung_builds", "failed_builds")}
    counts = {"kill_trials": args.kills, "concurrent_rounds": args.rounds, **counts}
    print(json.dumps(counts), flush=True)
    cpu = next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                if line.startswith("model name")), platform.processor())
    report = {"date": datetime.date.today().isoformat(), "benchmark": "bench/faults.py",
              "machine": {"cpu": cpu, "cores": len(os.sched_getaffinity(0)), "python": platform.python_version()},
              "catalog": {"kernels": len(c.keys), "tiles": list(TILES), "clusters": list(CLUSTERS)},
              "seed": args.seed, "cold_build_seconds": round(cold, 2),
              "wall_seconds": round(time.monotonic() - started, 1), "counts": counts, "kills": trials,
              "rounds": rounds}
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(report, indent=2) + "\n")
    bad = {k: v for k, v in counts.items() if k not in ("kill_trials", "kills_while_compiling", "kills_while_linking",
                                                         "concurrent_rounds", "resumes", "concurrent_builds") and v}
    sys.exit(f"faults found: {bad}" if bad else 0)


if __name__ == "__main__":
    main()
