"""The local pool keeps going when a compile kills its worker, hangs or grows past its limits."""

from __future__ import annotations

import time

import pytest

from builder.compile.job import CompileFailure, CompileJob
from builder.compile.limits import Limits
from builder.compile.parallel import LocalExecutor

pytestmark = pytest.mark.compile


def test_a_kernel_that_kills_its_worker_fails_alone():
    jobs = [CompileJob("raises_a", "sm_90a", "raise ValueError('bad kernel a')\n"),
            CompileJob("kills", "sm_90a", "import os, signal\nos.kill(os.getpid(), signal.SIGKILL)\n"),
            CompileJob("raises_b", "sm_90a", "raise ValueError('bad kernel b')\n"),
            CompileJob("raises_c", "sm_90a", "raise ValueError('bad kernel c')\n")]
    results = {r.kernel_id: r for r in LocalExecutor(2).run(jobs)}
    assert sorted(results) == sorted(j.kernel_id for j in jobs), "one result per job"
    assert all(isinstance(r, CompileFailure) for r in results.values())
    assert "compile worker died" in results["kills"].message
    assert results["kills"].rule == "COMPILE-CRASHED"
    for name in ("a", "b", "c"):
        assert f"ValueError: bad kernel {name}" in results[f"raises_{name}"].message
        assert results[f"raises_{name}"].rule == "COMPILE-FAILED"
        assert results[f"raises_{name}"].facts == {"exception": "ValueError"}


# Jobs whose rendered source, when the worker imports it, hangs or grows without bound.
HANGS = "import time\ntime.sleep(600)\n"
# GROWS reaches 2 GB at once and then holds it: grown step by step with pauses, on a loaded
# 2-core machine it once stayed under the memory limit until the time limit killed it first.
GROWS = ("import time\nheld = []\nfor _ in range(40):\n    held.append(b'x' * 50_000_000)\n"
         "time.sleep(600)\n")


def test_a_job_past_its_time_or_memory_limit_is_killed_and_fails_alone():
    limits = Limits(seconds=5, memory_bytes=1_500_000_000)
    jobs = [CompileJob("hangs", "sm_90a", HANGS), CompileJob("grows", "sm_90a", GROWS),
            CompileJob("raises", "sm_90a", "raise ValueError('bad kernel')\n")]
    start = time.monotonic()
    results = {r.kernel_id: r for r in LocalExecutor(2, limits).run(jobs)}
    assert time.monotonic() - start < 60, "the limits, not the jobs, end the run"
    assert sorted(results) == ["grows", "hangs", "raises"]
    hangs, grows = results["hangs"], results["grows"]
    assert hangs.rule == "COMPILE-TIMEOUT" and hangs.facts["limit_seconds"] == 5
    assert 5 <= hangs.facts["elapsed_seconds"] < 15
    assert grows.rule == "COMPILE-MEMORY" and grows.facts["limit_bytes"] == 1_500_000_000
    assert grows.facts["resident_bytes"] > 1_500_000_000 and grows.facts["elapsed_seconds"] < 5
    assert results["raises"].rule == "COMPILE-FAILED"


def test_a_worker_keeps_its_temporary_files_in_the_scratch_directory(tmp_path):
    source = "import tempfile\nraise ValueError(tempfile.mkdtemp(prefix='dsl-'))\n"
    (result,) = LocalExecutor(1).run([CompileJob("temp", "sm_90a", source)], tmp_path)
    made = result.message.rsplit("ValueError: ", 1)[1]
    assert made.startswith(str(tmp_path)), result.message
