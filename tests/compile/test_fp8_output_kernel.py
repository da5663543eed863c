"""fp8 e4m3 results: the kernels build without spills, round with the saturating conversion
(F2FP.SATFINITE.E4M3, cvt.rn.satfinite.e4m3x2.f32) and read scale_result, one more 32-bit global
load than their bf16-result twins, store C with plain shared stores (stmatrix is 16-bit only) and
TMA; kernels with another C never convert to e4m3; and each launches through the
glue as its plan says."""

from __future__ import annotations

import re
from collections import Counter

import pytest

from builder.compile.cubin import disassemble
from tests.compile.conftest import build_catalogs, sm90_catalog
from tests.compile.test_launch_record import Recorded, link_recording_library, run_kernel

pytestmark = pytest.mark.compile

CATALOG = sm90_catalog("""\
  - {}
  - dtypes: {a: e4m3, b: e4m3, acc: f32, c: bf16}
  - tile: [128, 256, 128]
    cluster: [2, 1]
  - schedule: pingpong
    tile: [64, 128, 128]
  - scaling: rowwise
    activation: relu
  - swap_ab: true
    tile: [64, 32, 128]
""", dtypes="{a: e4m3, b: e4m3, acc: f32, c: e4m3}", layout="tn", tile="[128, 128, 128]", cluster="[1, 1]")

FP8_OUT = "gemm_sm90_e4m3_e4m3_f32_e4m3_tn_128x128x128_c1x1"
BF16_OUT = "gemm_sm90_e4m3_e4m3_f32_bf16_tn_128x128x128_c1x1"
SATFINITE = re.compile(r"\bF2FP\.SATFINITE\.E4M3\.F32\b")
LOADS = re.compile(r"\bLDG\.E(\.U16)?(?:\.[A-Z0-9]+)*\b")


@pytest.fixture(scope="module")
def fp8_build(tmp_path_factory):
    base = tmp_path_factory.mktemp("fp8_output")
    result = build_catalogs(base, {"sm90.yaml": CATALOG})
    return result


def test_e4m3_results_saturate_read_scale_result_and_store_through_shared_memory(fp8_build):
    sass = {r.kernel_id: disassemble(r.cubin) for r in fp8_build.bundles[0].records}
    assert FP8_OUT in sass and BF16_OUT in sass and len(sass) == 6, sorted(sass)
    for record in fp8_build.bundles[0].records:
        assert not record.info.spills and record.info.local_bytes == 0, record.kernel_id
        text = sass[record.kernel_id]
        census = dict(record.info.census)
        if record.ctx.entry.config.dtypes.c.value == "e4m3":
            assert SATFINITE.search(text), record.kernel_id
            # No stmatrix for 8-bit values: each thread stores its own values (pairs of adjacent columns
            # of a row-major C; single bytes of a swapped, M-major one), then TMA stores the sub-tile.
            stores = "STS.U8" if record.ctx.entry.config.swap_ab else "STS.U16"
            assert census["STSM"] == 0 and census["UTMASTG"] > 0 and stores in text, record.kernel_id
        else:
            assert "E4M3" not in " ".join(re.findall(r"\bF2FP\.[A-Z0-9.]*", text)), record.kernel_id
    loads = {k: Counter("u16" if m.group(1) else "b32" for m in LOADS.finditer(t)) for k, t in sass.items()}
    # scale_a, scale_b and scale_result; the bf16 twin reads the first two.
    assert loads[FP8_OUT]["b32"] == loads[BF16_OUT]["b32"] + 1, loads


def test_the_rendered_kernel_takes_scale_result_only_with_an_e4m3_c(fp8_build):
    for record in fp8_build.bundles[0].records:
        rendered = (fp8_build.bundles[0].path / "sources" / f"{record.kernel_id}.py.txt").read_text()
        passes = re.search(r"self\.kernel\([^)]*\bscale_result,", rendered) is not None
        assert passes == (record.ctx.entry.config.dtypes.c.value == "e4m3"), record.kernel_id


def test_e4m3_result_kernels_launch_as_their_plan_says(fp8_build, tmp_path):
    (bundle,) = fp8_build.bundles
    recorded = Recorded(bundle, link_recording_library(bundle, tmp_path / "lib"), tmp_path)
    for kernel_id in recorded.records:
        _, pairs = run_kernel(recorded, kernel_id)
        for expected, launched in pairs:
            assert launched == expected, kernel_id
