"""The grouped kernels' host launch path against the recording stand-in for the driver
(tests/compile/test_launch_record.py): two grouped kernels, built deviceless and linked with
the recorder, are planned and launched through tilekiln.grouped (the path of
``tilekiln.grouped_gemm``), and each must launch through the driver with grid (1, cluster_n,
min(work-item bound, resident clusters)), where the bound is what the host can count without
reading ``offs``: (ceil(total_M / tile M) + G) x the N tiles; the plan's threads and dynamic
shared memory (the group table included); programmatic serialization."""

from __future__ import annotations

import math

import pytest

from tests.compile.conftest import make_project, run_build
from tests.compile.test_launch_record import (LAUNCH_CLUSTER_DIM, Launch, Recorded, link_recording_library,
                                              recorded_launch)
from tilekiln._tensors import Operand
from tilekiln.grouped import launch_grouped, make_grouped_problem, plan_grouped

pytestmark = pytest.mark.compile

CATALOG = """pipeline: sm90
targets: [sm_90a]
defaults:
  family: grouped
  dtypes: {a: bf16, b: bf16, acc: f32, c: bf16}
  layout: tn
kernels:
  - tile: [128, 256, 64]
    cluster: [1, 1]
  - tile: [64, 128, 64]
    cluster: [1, 2]
    schedule: pingpong
"""
# (total_M, N, K, G): decode-sized, ragged, large with many groups, one group.
PROBLEMS = ((16, 4096, 4096, 8), (1008, 1040, 528, 3), (8192, 1536, 2048, 128), (300, 256, 128, 1))


@pytest.fixture(scope="module")
def recorded(tmp_path_factory) -> Recorded:
    base = tmp_path_factory.mktemp("grouped")
    result = run_build(make_project(base / "project", CATALOG), base / "artifacts", base / "cache")
    assert result.ok, [r.error for b in result.bundles for r in b.failed]
    bundle = result.bundles[0]
    return Recorded(bundle, link_recording_library(bundle, base / "lib"), base)


def test_every_grouped_kernel_launches_as_its_plan_says(recorded):
    assert len(recorded.records) == 2
    for kernel_id, record in recorded.records.items():
        ctx = record.ctx
        cfg, plan = ctx.entry.config, ctx.plan
        recorded.configure(record.info.static_smem_bytes, ctx.facts.require("smem_per_block_optin"))
        for m, n, k, groups in PROBLEMS:
            a = Operand("a", (m, k), (k, 1), "bf16", 0x7F0000000000, 0, None)
            b = Operand("b", (groups, k, n), (n * k, 1, k), "bf16", 0x7F1000000000, 0, None)
            offs = Operand("offs", (groups,), (1,), "i32", 0x7F3000000000, 0, None)
            out = Operand("out", (m, n), (n, 1), "bf16", 0x7F2000000000, 0, None)
            grouped = plan_grouped(recorded.bundle, make_grouped_problem(a, b, offs, out, False), kernel_id)
            kernel = next(kr for kr in recorded.bundle.kernels if kr.id == kernel_id)
            resident = recorded.bundle.resident_clusters(kernel, 0)
            before = len(recorded.events())
            launch_grouped(recorded.bundle, grouped, a.ptr, b.ptr, out.ptr, offs.ptr, 0)
            (launch,) = [e for e in recorded.events()[before:] if e["event"] == "launch"]
            assert launch["path"] == "driver", launch
            bound = (math.ceil(m / cfg.tile.m) + groups) * math.ceil(math.ceil(n / cfg.tile.n) / cfg.cluster.n)
            expected = Launch((1, cfg.cluster.n, max(1, min(bound, resident))), (plan.threads, 1, 1),
                              plan.smem.dynamic_bytes, (1, cfg.cluster.n, 1), 1)
            assert recorded_launch(launch) == expected, (kernel_id, m, n, k, groups)
            assert LAUNCH_CLUSTER_DIM in {attr["id"] for attr in launch["attributes"]}


def test_a_misaligned_offs_pointer_is_refused_before_the_launch(recorded):
    kernel_id = sorted(recorded.records)[0]
    a = Operand("a", (64, 128), (128, 1), "bf16", 0x7F0000000000, 0, None)
    b = Operand("b", (2, 128, 256), (256 * 128, 1, 128), "bf16", 0x7F1000000000, 0, None)
    offs = Operand("offs", (2,), (1,), "i32", 0x7F3000000002, 0, None)
    grouped = plan_grouped(recorded.bundle, make_grouped_problem(a, b, offs, None, False), kernel_id)
    before = len(recorded.events())
    with pytest.raises(ValueError, match="offs: data pointer 0x7f3000000002 is not 4-byte aligned"):
        launch_grouped(recorded.bundle, grouped, a.ptr, b.ptr, 0x7F2000000000, offs.ptr, 0)
    with pytest.raises(ValueError, match="out: data pointer 0x7f2000000008 is not 16-byte aligned"):
        launch_grouped(recorded.bundle, grouped, a.ptr, b.ptr, 0x7F2000000008, 0x7F3000000000, 0)
    assert not [e for e in recorded.events()[before:] if e["event"] == "launch"]
