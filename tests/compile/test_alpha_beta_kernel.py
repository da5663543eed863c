"""alpha and beta (kernel field scalars): an alphabeta kernel compiles alpha into one multiply per
accumulator value and beta into the residual's add (a fused multiply-add), without spills, and
launches as its plan says through the glue, which passes both by value."""

from __future__ import annotations

import re

import pytest

from builder.compile.cubin import disassemble
from tests.compile.conftest import build_catalogs, sm90_catalog
from tests.compile.test_launch_record import Recorded, link_recording_library, run_kernel

pytestmark = pytest.mark.compile

CATALOG = sm90_catalog("""\
  - sweep:
      residual: [none, add]
      scalars: [none, alphabeta]
  - swap_ab: true
    tile: [64, 16, 64]
    residual: add
    scalars: alphabeta
""", dtypes="{a: bf16, b: bf16, acc: f32, c: bf16}", layout="tn", tile="[128, 128, 64]", cluster="[1, 1]")

BF16 = "gemm_sm90_bf16_bf16_f32_bf16_tn_128x128x64_c1x1"
SWAPPED = "gemm_sm90_bf16_bf16_f32_bf16_tn_64x16x64_c1x1_swapab_resadd_alphabeta"


def _count(opcode: str, sass: str) -> int:
    return len(re.findall(rf"\b{opcode}\b", sass))


@pytest.fixture(scope="module")
def alpha_beta_build(tmp_path_factory):
    base = tmp_path_factory.mktemp("alpha_beta")
    result = build_catalogs(base, {"sm90.yaml": CATALOG})
    return result


def test_alpha_multiplies_every_value_and_beta_fuses_into_the_residual_add(alpha_beta_build):
    sass = {}
    for record in alpha_beta_build.bundles[0].records:
        sass[record.kernel_id] = disassemble(record.cubin)
        assert not record.info.spills and record.info.local_bytes == 0, record.kernel_id
    assert set(sass) == {BF16, f"{BF16}_alphabeta", f"{BF16}_resadd", f"{BF16}_resadd_alphabeta", SWAPPED}
    # A consumer thread holds 64 of the 128x128 tile's accumulator values (two warpgroups).
    assert _count("FMUL", sass[f"{BF16}_alphabeta"]) >= _count("FMUL", sass[BF16]) + 64
    assert _count("FMUL", sass[f"{BF16}_resadd_alphabeta"]) >= _count("FMUL", sass[f"{BF16}_resadd"]) + 64
    # beta * residual + value: one FFMA per residual element read, where the plain residual adds.
    assert _count("FFMA", sass[f"{BF16}_resadd_alphabeta"]) >= _count("FFMA", sass[f"{BF16}_resadd"]) + 64
    assert _count("FMUL", sass[SWAPPED]) > 0 and _count("FFMA", sass[SWAPPED]) > 0


def test_alpha_beta_kernels_launch_as_their_plan_says(alpha_beta_build, tmp_path):
    (bundle,) = alpha_beta_build.bundles
    recorded = Recorded(bundle, link_recording_library(bundle, tmp_path / "lib"), tmp_path)
    for kernel_id in recorded.records:
        _, pairs = run_kernel(recorded, kernel_id)
        for expected, launched in pairs:
            assert launched == expected, kernel_id
