"""A ping-pong sm90 kernel compiles to the shared memory and registers its plan predicts."""

from __future__ import annotations

import json

import pytest

from builder.check.derive.sm90 import sm90_smem
from builder.check.validate import Project, validate_project
from tests.compile.conftest import make_project, run_build, sm90_catalog
from tilekiln.spec import Schedule

pytestmark = pytest.mark.compile

CATALOG = sm90_catalog("""\
  - tile: [64, 256, 64]
    cluster: [2, 1]
    sweep:
      schedule: [pingpong, cooperative]
""", dtypes="{a: bf16, b: bf16, acc: f32, c: bf16}", layout="tn")


def test_pingpong_kernel_compiles_with_its_own_epilogue_buffers(tmp_path):
    project = make_project(tmp_path / "project", CATALOG)
    result = run_build(project, tmp_path / "artifacts", tmp_path / "cache", jobs=2)
    assert result.ok, [r.error for b in result.bundles for r in b.failed]
    manifest = json.loads((result.bundles[0].path / "manifest.json").read_text())
    kernels = {k["config"]["schedule"]: k for k in manifest["kernels"]}
    ping, coop = kernels["pingpong"], kernels["cooperative"]
    assert ping["id"].endswith("_c2x1_pingpong")
    for k in (ping, coop):
        sass = k["resources"]["sass"]
        assert sass["HGMMA"] > 0 and sass["LDL"] == 0 and sass["STL"] == 0 and not k["resources"]["spills"]

    # The plan (checked by the build against the traced Storage struct) gives
    # each of the two consumers its own epilogue buffers and adds the two
    # mbarriers that order their mainloops.
    ctxs = {c.entry.config.schedule: c for c in validate_project(Project(project)).kernels}
    ping_ctx, coop_ctx = ctxs[Schedule.PINGPONG], ctxs[Schedule.COOPERATIVE]
    p_ping, p_coop = ping_ctx.plan, coop_ctx.plan
    facts, template = ping_ctx.facts, ping_ctx.template
    assert (p_ping.consumer_wgs, p_ping.wg_tile_m, p_ping.threads) == (2, 64, 384)
    assert (p_coop.consumer_wgs, p_coop.wg_tile_m, p_coop.threads) == (1, 64, 256)
    assert p_ping.acc_regs_per_thread == p_coop.acc_regs_per_thread == 64 * 256 // 128
    one = sm90_smem(coop_ctx.entry.config, facts, template, p_ping.stages, 64, 32)
    two = sm90_smem(ping_ctx.entry.config, facts, template, p_ping.stages, 64, 32)
    assert two.epilogue_bytes == 2 * one.epilogue_bytes
    assert two.barrier_bytes == one.barrier_bytes + 2 * facts.require("mbarrier_bytes")
    assert ping["resources"]["smem_bytes"] == p_ping.smem.total
