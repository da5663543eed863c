"""The local pool keeps going when a compile kills its worker process."""

from __future__ import annotations

import pytest

from builder.compile.job import CompileFailure, CompileJob
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
