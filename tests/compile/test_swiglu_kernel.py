"""The swiglu activation: its kernels compile without spills, compute the gate's silu in the
epilogue (MUFU.EX2) and read no global memory outside TMA but an fp8 kernel's scales, and launch through the glue as their
plan says, over B's N columns with a C of N/2 (the recording driver of test_launch_record.py)."""

from __future__ import annotations

import pytest

from builder.compile.cubin import disassemble
from tests.compile.conftest import build_catalogs, sm90_catalog
from tests.compile.test_bias_kernel import LOADS
from tests.compile.test_launch_record import Recorded, link_recording_library, run_kernel

pytestmark = pytest.mark.compile

# The default catalog's swiglu tiles (ping-pong 128x128, cooperative 128x256) and an fp8 one,
# whose per-tensor scales apply to the gate and the up value before the product.
CATALOG = sm90_catalog("""\
  - tile: [128, 128, 64]
    schedule: pingpong
  - tile: [128, 256, 64]
  - dtypes: {a: e4m3, b: e4m3, acc: f32, c: bf16}
    tile: [128, 128, 128]
""", dtypes="{a: bf16, b: bf16, acc: f32, c: bf16}", layout="tn", cluster="[1, 1]", activation="swiglu")


@pytest.fixture(scope="module")
def swiglu_build(tmp_path_factory):
    base = tmp_path_factory.mktemp("swiglu")
    result = build_catalogs(base, {"sm90.yaml": CATALOG})
    return result


def test_swiglu_kernels_compute_silu_in_registers_without_spills(swiglu_build):
    records = swiglu_build.bundles[0].records
    assert len(records) == 3
    for record in records:
        sass = disassemble(record.cubin)
        assert not record.info.spills and record.info.local_bytes == 0, record.kernel_id
        assert "MUFU.EX2" in sass, record.kernel_id
        # An fp8 kernel reads its two per-tensor scales; the product needs no other global load.
        loads = len(LOADS.findall(sass))
        assert loads == (2 if record.ctx.entry.config.dtypes.scaled else 0), (record.kernel_id, loads)


# (M, N = 2I, K, batch): decode rows, I = 576 (not a multiple of either tile's 64 or 128 output
# columns), Llama-3 8B's gate_up, and a batch.
PROBLEMS = ((16, 2 * 576, 4096, 1), (1008, 2 * 14336, 4096, 1), (128, 256, 128, 2))


def test_swiglu_kernels_launch_as_their_plan_says(swiglu_build, tmp_path):
    (bundle,) = swiglu_build.bundles
    recorded = Recorded(bundle, link_recording_library(bundle, tmp_path / "lib"), tmp_path)
    for kernel_id in recorded.records:
        _, pairs = run_kernel(recorded, kernel_id, PROBLEMS)
        for expected, launched in pairs:
            assert launched == expected, kernel_id
