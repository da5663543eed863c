"""The activation field: each value compiles into the epilogue, and the plain kernel stays plain."""

from __future__ import annotations

import re
from collections import Counter

import pytest

from builder.compile.cubin import disassemble
from tests.compile.conftest import make_project, run_build, sm90_catalog

pytestmark = pytest.mark.compile

CATALOG = sm90_catalog("""\
  - sweep:
      activation: [none, relu, silu, gelutanh, geluerf]
  # fp8: the per-tensor scales are applied before the activation
  - dtypes: {a: e4m3, b: e4m3, acc: f32, c: bf16}
    tile: [128, 128, 128]
    activation: silu
""", dtypes="{a: bf16, b: bf16, acc: f32, c: bf16}", layout="tn", tile="[128, 128, 64]", cluster="[1, 1]")

# The instruction each activation cannot do without: a float max for relu, the exponential
# unit for silu (its sigmoid) and both GELU forms (tanh and erf are built from exp).
SIGNATURE = {"relu": "FMNMX", "silu": "MUFU.EX2", "gelutanh": "MUFU.EX2", "geluerf": "MUFU.EX2"}


def test_each_activation_lands_in_the_epilogue_and_only_there(tmp_path):
    project = make_project(tmp_path / "project", CATALOG)
    result = run_build(project, tmp_path / "artifacts", tmp_path / "cache", jobs=2)
    assert result.ok, [r.error for b in result.bundles for r in b.failed]
    ops = {}
    for record in result.bundles[0].records:
        sass = disassemble(record.cubin)
        ops[record.kernel_id] = Counter(re.findall(r"\b(MUFU\.EX2|FMNMX)\b", sass))
        assert not record.info.spills and record.info.local_bytes == 0, record.kernel_id
    base = "gemm_sm90_bf16_bf16_f32_bf16_tn_128x128x64_c1x1"
    assert not ops[base], f"the plain kernel computes an activation: {ops[base]}"
    for activation, instruction in SIGNATURE.items():
        assert ops[f"{base}_{activation}"][instruction] > 0, (activation, ops[f"{base}_{activation}"])
    assert ops["gemm_sm90_e4m3_e4m3_f32_bf16_tn_128x128x128_c1x1_silu"]["MUFU.EX2"] > 0
