"""The sm90 swiglu epilogue multiplies each gate value by the up value of its own output column.

A swiglu kernel stores output sub-tile e from two accumulator sub-tiles, gate and up
(``_glu_subtiles`` in templates/common/persistent.j2), reading fragment value v of each at
``sub-tile * frag_size + v``. Traced in the DSL on the CPU for the template's constructions on
the default catalog's swiglu tiles, for every consumer thread, output sub-tile and value: the
gate value and the up value sit in the same row, GLU_BLOCK columns apart, and the gate's column
is the one the stored value's output column c pairs with, 2 * GLU_BLOCK * (c // GLU_BLOCK) +
c % GLU_BLOCK. The trace runs in a subprocess of its own file (tests/compile/test_bias_coordinates.py
says why).
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tilekiln.spec import GLU_BLOCK

pytestmark = pytest.mark.compile

# (tile M, tile N, warpgroups per tile, epilogue sub-tile M x N) of the catalog's swiglu kernels
# (builder/check/derive/sm90.py): ping-pong 64x128 and 128x128 (one warpgroup per tile),
# cooperative 128x256 (two).
CASES = (
    (64, 128, 1, 64, 32),
    (128, 128, 1, 64, 32),
    (128, 256, 2, 128, 32),
)

SCRIPT = r"""
import json, sys
from builder.compile.job import prepare_worker
prepare_worker()
import cutlass, cutlass.cute as cute
import cutlass.utils.hopper_helpers as sm90_helpers
from cutlass.tensor_utils import LayoutEnum

K_MAJOR = cute.nvgpu.OperandMajorMode.K
THREAD_STEP = 7
GLU_BLOCK = int(sys.argv[2])


def glu_subtiles(e, tile_n, epi_n):
    # templates/common/persistent.j2, _glu_subtiles
    per_block = GLU_BLOCK // epi_n
    out_row, acc_row = tile_n // 2 // epi_n, tile_n // epi_n
    m, j = e // out_row, e % out_row
    gate = m * acc_row + (j // per_block) * 2 * per_block + j % per_block
    return gate, gate + per_block


def check(tile_m, tile_n, wgs, epi_m, epi_n):
    c_layout = LayoutEnum.ROW_MAJOR
    found = {"threads": 0, "checked": 0, "mismatched": 0}

    @cute.jit
    def trace():
        tiled_mma = sm90_helpers.make_trivial_tiled_mma(cutlass.BFloat16, cutlass.BFloat16, K_MAJOR, K_MAJOR,
                                                        cutlass.Float32, (wgs, 1, 1), tiler_mn=(64, tile_n))
        store_atom = sm90_helpers.get_smem_store_op(c_layout, cutlass.BFloat16, cutlass.Float32)
        stmatrix = cute.make_copy_atom(cute.nvgpu.warp.StMatrix8x8x16bOp(False, 4), cutlass.BFloat16)
        r2s = cute.make_tiled_copy_S(store_atom, cute.make_tiled_copy_C_atom(stmatrix, tiled_mma))
        out_count = tile_n // 2 // epi_n
        for t in cutlass.range_constexpr(0, 128 * wgs, THREAD_STEP):
            thr_r2s = r2s.get_slice(t)
            coord = thr_r2s.partition_S(cute.make_identity_tensor((epi_m, epi_n)))
            acc = r2s.retile(tiled_mma.get_slice(t).partition_C(cute.make_identity_tensor((tile_m, tile_n))))
            frag = cute.size(coord)
            found["threads"] += 1
            for e in cutlass.range_constexpr(cute.size(acc) // frag // 2):
                gate, up = glu_subtiles(e, tile_n, epi_n)
                origin = ((e // out_count) * epi_m, (e % out_count) * epi_n)
                for v in cutlass.range_constexpr(frag):
                    row, col = coord[v]
                    out_row, out_col = origin[0] + row, origin[1] + col
                    want = (out_row, 2 * GLU_BLOCK * (out_col // GLU_BLOCK) + out_col % GLU_BLOCK)
                    g, u = tuple(acc[gate * frag + v]), tuple(acc[up * frag + v])
                    found["checked"] += 1
                    found["mismatched"] += int(g != want or u != (want[0], want[1] + GLU_BLOCK))

    cute.compile(trace, options="--gpu-arch sm_90a")
    return found


print(json.dumps([check(*case) for case in json.loads(sys.argv[1])]))
"""


def test_each_gate_value_meets_the_up_value_of_its_output_column(root, tmp_path):
    script = tmp_path / "trace_swiglu_coordinates.py"  # the DSL reads a jit function's source from its file
    script.write_text(SCRIPT)
    proc = subprocess.run([sys.executable, str(script), json.dumps(CASES), str(GLU_BLOCK)], capture_output=True,
                          text=True, cwd=root, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    results = json.loads(proc.stdout.strip().splitlines()[-1])
    for case, found in zip(CASES, results, strict=True):
        tile_m, tile_n, wgs = case[:3]
        # Each thread stores half its tile M x N / threads accumulator values, each from a gate and an up.
        assert found["checked"] == found["threads"] * tile_m * tile_n // 2 // (128 * wgs), (case, found)
        assert found["mismatched"] == 0, (case, found)
