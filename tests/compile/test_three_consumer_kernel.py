"""A 192-row cooperative sm90 kernel splits its tile over three consumer warpgroups."""

from __future__ import annotations

import json

import pytest

from builder.check.validate import Project, validate_project
from tests.compile.conftest import make_project, run_build, sm90_catalog

pytestmark = pytest.mark.compile

CATALOG = sm90_catalog("""\
  - tile: [192, 192, 64]
    cluster: [1, 2]
""", dtypes="{a: bf16, b: bf16, acc: f32, c: bf16}", layout="tn")


def test_three_consumers_share_the_registers_the_producer_gives_up(tmp_path):
    project = make_project(tmp_path / "project", CATALOG)
    result = run_build(project, tmp_path / "artifacts", tmp_path / "cache")
    assert result.ok, [r.error for b in result.bundles for r in b.failed]
    bundle = result.bundles[0].path
    (kernel,) = json.loads((bundle / "manifest.json").read_text())["kernels"]
    ctx = validate_project(Project(project)).kernels[0]
    plan, facts = ctx.plan, ctx.facts
    # One 64-row MMA block per consumer; the producer's 32 registers leave each
    # consumer 160, the whole register file at 512 threads.
    assert (plan.consumer_wgs, plan.wg_tile_m, plan.threads) == (3, 64, 512)
    assert (plan.producer_regs, plan.consumer_regs, plan.acc_regs_per_thread) == (32, 160, 96)
    wg = facts.require("threads_per_warpgroup")
    assert plan.producer_regs * wg + 3 * plan.consumer_regs * wg == facts.require("registers_per_sm")
    assert kernel["threads"] == 512 and kernel["resources"]["smem_bytes"] == plan.smem.total
    sass = kernel["resources"]["sass"]
    assert sass["HGMMA"] > 0 and sass["LDL"] == sass["STL"] == 0 and not kernel["resources"]["spills"]
    source = (bundle / kernel["source"]["file"]).read_text()
    assert "CONSUMER_WGS = 3" in source and "PRODUCER_REGS = 32" in source and "CONSUMER_REGS = 160" in source
