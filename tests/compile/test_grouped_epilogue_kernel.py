"""The grouped expert-MLP epilogues (issue 32), built deviceless: the SwiGLU and row-wise kernels
compile without spills, a gated kernel computes silu (MUFU.EX2) and stores half the columns its
plain twin does through stmatrix, the epilogue reads global memory only for the row-wise scales,
and each kernel launches through the glue as its plan says, its work items counted over B's N
columns (the recording driver of test_launch_record.py)."""

from __future__ import annotations

import math

import pytest

from builder.compile.cubin import disassemble
from tests.compile.conftest import build_catalogs, sm90_catalog
from tests.compile.test_bias_kernel import LOADS
from tests.compile.test_launch_record import Launch, Recorded, link_recording_library, recorded_launch
from tilekiln._tensors import Operand
from tilekiln.grouped import launch_grouped, make_grouped_problem, make_masked_problem, plan_grouped
from tilekiln.problem import requested_epilogue

pytestmark = pytest.mark.compile

# Each epilogue kernel with its plain twin (same tile and schedule): bf16 SwiGLU, fp8 row-wise with
# and without SwiGLU, and a masked fp8 row-wise SwiGLU.
CATALOG = sm90_catalog("""\
  - dtypes: {a: bf16, b: bf16, acc: f32, c: bf16}
    tile: [128, 128, 64]
    sweep:
      activation: [none, swiglu]
  - dtypes: {a: e4m3, b: e4m3, acc: f32, c: bf16}
    tile: [128, 128, 128]
    sweep:
      scaling: [tensor, rowwise]
  - dtypes: {a: e4m3, b: e4m3, acc: f32, c: bf16}
    tile: [128, 128, 128]
    scaling: rowwise
    activation: swiglu
  - family: grouped_masked
    dtypes: {a: e4m3, b: e4m3, acc: f32, c: bf16}
    schedule: pingpong
    tile: [64, 128, 128]
    scaling: rowwise
    activation: swiglu
""", family="grouped", layout="tn", cluster="[1, 1]")
BF16_PLAIN = "grouped_sm90_bf16_bf16_f32_bf16_tn_128x128x64_c1x1"
FP8_PLAIN = "grouped_sm90_e4m3_e4m3_f32_bf16_tn_128x128x128_c1x1"
# (total_M, N = 2I, K, G): decode-sized, ragged, many groups, one group.
PROBLEMS = ((16, 2 * 1536, 2048, 8), (1008, 2 * 576, 528, 3), (8192, 1536, 2048, 128), (300, 256, 128, 1))


@pytest.fixture(scope="module")
def build(tmp_path_factory):
    base = tmp_path_factory.mktemp("grouped_epilogues")
    result = build_catalogs(base, {"sm90.yaml": CATALOG})
    return result


def test_epilogue_kernels_compile_without_spills_and_store_what_they_compute(build):
    records = {r.kernel_id: r for r in build.bundles[0].records}
    assert len(records) == 6
    loads = {kid: len(LOADS.findall(disassemble(r.cubin))) for kid, r in records.items()}
    for kernel_id, record in records.items():
        cfg = record.ctx.entry.config
        assert not record.info.spills and record.info.local_bytes == 0, kernel_id
        if cfg.family != "grouped" or kernel_id in (BF16_PLAIN, FP8_PLAIN):
            continue
        twin = records[BF16_PLAIN if cfg.dtypes.a.value == "bf16" else FP8_PLAIN]
        if cfg.activation.gated:
            assert "MUFU.EX2" in disassemble(record.cubin), kernel_id
            # N/2 columns leave through stmatrix: half the plain kernel's sub-tiles.
            assert 2 * record.info.count("STSM") == twin.info.count("STSM"), kernel_id
        # The plain kernel's loads are the group table's (and per-tensor scales); a row-wise kernel adds its
        # scale reads, a bf16 SwiGLU none.
        if cfg.scaling.value == "rowwise":
            assert loads[kernel_id] > loads[twin.kernel_id], kernel_id
        else:
            assert loads[kernel_id] == loads[twin.kernel_id], kernel_id


def test_epilogue_kernels_launch_as_their_plan_says(build, tmp_path):
    (bundle,) = build.bundles
    recorded = Recorded(bundle, link_recording_library(bundle, tmp_path / "lib"), tmp_path)
    for kernel_id, record in recorded.records.items():
        cfg, plan = record.ctx.entry.config, record.ctx.plan
        if not (cfg.activation.gated or cfg.scaling.value == "rowwise"):
            continue
        recorded.configure(record.info.static_smem_bytes, record.ctx.facts.require("smem_per_block_optin"))
        requested = requested_epilogue(scaling=cfg.scaling.value, activation=cfg.activation.value)
        dtype = cfg.dtypes.a.value
        masked = cfg.family == "grouped_masked"
        out_n = (lambda n: n // 2) if cfg.activation.gated else (lambda n: n)
        for m, n, k, groups in PROBLEMS:
            b = Operand("b", (groups, k, n), (n * k, 1, k), dtype, 0x7F1000000000, 0, None)
            rows = Operand("rows", (groups,), (1,), "i32", 0x7F3000000000, 0, None)
            if masked:
                a = Operand("a", (groups, m, k), (m * k, k, 1), dtype, 0x7F0000000000, 0, None)
                out = Operand("out", (groups, m, out_n(n)), (m * out_n(n), out_n(n), 1), "bf16", 0x7F2000000000, 0,
                              None)
                problem = make_masked_problem(a, b, rows, out, dtype == "e4m3", requested)
                bound = math.ceil(m / cfg.tile.m) * groups * math.ceil(n / cfg.tile.n)
            else:
                a = Operand("a", (m, k), (k, 1), dtype, 0x7F0000000000, 0, None)
                out = Operand("out", (m, out_n(n)), (out_n(n), 1), "bf16", 0x7F2000000000, 0, None)
                problem = make_grouped_problem(a, b, rows, out, dtype == "e4m3", requested)
                bound = (math.ceil(m / cfg.tile.m) + groups) * math.ceil(n / cfg.tile.n)
            grouped = plan_grouped(recorded.bundle, problem, kernel_id)
            assert grouped.unfused == () and grouped.run.out_shape == problem.out_shape
            kernel = next(kr for kr in recorded.bundle.kernels if kr.id == kernel_id)
            resident = recorded.bundle.resident_clusters(kernel, 0)
            before = len(recorded.events())
            launch_grouped(recorded.bundle, grouped, a.ptr, b.ptr, out.ptr, rows.ptr, 0, 0x7F4000000000,
                           0x7F5000000000)
            (launch,) = [e for e in recorded.events()[before:] if e["event"] == "launch"]
            assert launch["path"] == "driver", launch
            expected = Launch((1, 1, max(1, min(bound, resident))), (plan.threads, 1, 1), plan.smem.dynamic_bytes,
                              (1, 1, 1), 1)
            assert recorded_launch(launch) == expected, (kernel_id, m, n, k, groups)
