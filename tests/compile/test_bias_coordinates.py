"""The coordinates the sm90 epilogue reads the bias (and row-wise scales and residual) at are those
of the values it stores.

A bias kernel takes the sub-tile coordinate of fragment value v from the r2s copy's source
partition of an identity tensor (templates/sm90_gemm.py.j2), and adds bias[tile origin +
sub-tile origin + that coordinate's column] (its row under swap_ab). Traced in the DSL on the
CPU for the template's constructions on the default catalog's bias tiles, that coordinate
must be the one the accumulator value holds, ``retile(partition_C(identity(tile)))`` at
``e * frag_size + v``, for every consumer thread, sub-tile and value; and it must differ from
the copy's destination partition (where stmatrix addresses), which would be the wrong choice.
An fp32 or e4m3 result is stored with plain shared stores, which write each value at its own
coordinate: there the destination partition must be the source's. The trace runs in a subprocess of its own file: the DSL's compile environment hides GPUs from
its process, and it reads a jit function's source from its file.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

pytestmark = pytest.mark.compile

# (C layout, C type, tile M, tile N, warpgroups per tile, epilogue sub-tile M x N) as the
# template and its plan (builder/check/derive/sm90.py: epi_m = min(tile M, 64 x warpgroups),
# epi_n = min(tile N, 32)) make them for the catalog's bias kernels: swapped 64x16, ping-pong
# 64x128 and 128x128 (one warpgroup per tile), cooperative 128x256 (two); and an f32 result.
# The row-wise and residual kernels read their row scales and residual rows at the same
# coordinate's row: their further tiles, swapped 64x32, ping-pong 64x256, cooperative 128x192,
# 128x224 and 64x64 (one warpgroup). The e4m3-result kernels' cooperative 128x256 and 128x128 and
# ping-pong 64x128 tiles and a swapped 64x32 one store 8-bit values with plain shared stores.
CASES = (
    ("col", "bf16", 64, 16, 1, 64, 16),
    ("row", "bf16", 64, 128, 1, 64, 32),
    ("row", "bf16", 128, 128, 1, 64, 32),
    ("row", "bf16", 128, 256, 2, 128, 32),
    ("row", "f32", 128, 128, 2, 128, 32),
    ("col", "bf16", 64, 32, 1, 64, 32),
    ("row", "bf16", 64, 256, 1, 64, 32),
    ("row", "bf16", 128, 192, 2, 128, 32),
    ("row", "bf16", 128, 224, 2, 128, 32),
    ("row", "bf16", 64, 64, 1, 64, 32),
    ("row", "e4m3", 128, 256, 2, 128, 32),
    ("row", "e4m3", 128, 128, 2, 128, 32),
    ("row", "e4m3", 64, 128, 1, 64, 32),
    ("col", "e4m3", 64, 32, 1, 64, 32),
)

SCRIPT = r"""
import json, sys
from builder.compile.job import prepare_worker
prepare_worker()
import cutlass, cutlass.cute as cute
import cutlass.utils.hopper_helpers as sm90_helpers
from cutlass.tensor_utils import LayoutEnum

K_MAJOR = cute.nvgpu.OperandMajorMode.K
# Every lane of a warp, over the warps and warpgroups (the layouts are affine in the thread).
THREAD_STEP = 7
results = []


def check(layout, c_type, tile_m, tile_n, wgs, epi_m, epi_n):
    c_layout = LayoutEnum.COL_MAJOR if layout == "col" else LayoutEnum.ROW_MAJOR
    c_dtype = {"bf16": cutlass.BFloat16, "f32": cutlass.Float32, "e4m3": cutlass.Float8E4M3FN}[c_type]
    found = {"threads": 0, "checked": 0, "mismatched": 0, "destination_differs": False}

    @cute.jit
    def trace():
        tiled_mma = sm90_helpers.make_trivial_tiled_mma(cutlass.BFloat16, cutlass.BFloat16, K_MAJOR, K_MAJOR,
                                                        cutlass.Float32, (wgs, 1, 1), tiler_mn=(64, tile_n))
        store_atom = sm90_helpers.get_smem_store_op(c_layout, c_dtype, cutlass.Float32)
        stmatrix = cute.make_copy_atom(cute.nvgpu.warp.StMatrix8x8x16bOp(c_layout.is_m_major_c(), 4), c_dtype)
        r2s = cute.make_tiled_copy_S(store_atom, cute.make_tiled_copy_C_atom(stmatrix, tiled_mma))
        n_count = tile_n // epi_n
        # Static loops (range_constexpr): the checks run while tracing, on static coordinates.
        for t in cutlass.range_constexpr(0, 128 * wgs, THREAD_STEP):
            thr_r2s = r2s.get_slice(t)
            coord = thr_r2s.partition_S(cute.make_identity_tensor((epi_m, epi_n)))
            dest = thr_r2s.partition_D(cute.make_identity_tensor((epi_m, epi_n)))
            acc = r2s.retile(tiled_mma.get_slice(t).partition_C(cute.make_identity_tensor((tile_m, tile_n))))
            frag = cute.size(coord)
            found["threads"] += 1
            for e in cutlass.range_constexpr(cute.size(acc) // frag):
                origin = ((e // n_count) * epi_m, (e % n_count) * epi_n)
                for v in cutlass.range_constexpr(frag):
                    row, col = coord[v]
                    found["checked"] += 1
                    found["mismatched"] += int((origin[0] + row, origin[1] + col) != tuple(acc[e * frag + v]))
                    found["destination_differs"] |= tuple(dest[v]) != (row, col)

    cute.compile(trace, options="--gpu-arch sm_90a")
    return found


print(json.dumps([check(*case) for case in json.loads(sys.argv[1])]))
"""


def test_the_bias_coordinate_is_the_stored_values(root, tmp_path):
    script = tmp_path / "trace_bias_coordinates.py"  # the DSL reads a jit function's source from its file
    script.write_text(SCRIPT)
    proc = subprocess.run([sys.executable, str(script), json.dumps(CASES)], capture_output=True, text=True,
                          cwd=root, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    results = json.loads(proc.stdout.strip().splitlines()[-1])
    for case, found in zip(CASES, results, strict=True):
        _, c_type, tile_m, tile_n, wgs = case[:5]
        # Each thread holds tile M x N / threads values of the tile.
        assert found["checked"] == found["threads"] * tile_m * tile_n // (128 * wgs), (case, found)
        assert found["mismatched"] == 0, (case, found)
        if c_type == "bf16":
            assert found["destination_differs"], (case, "stmatrix's destination partition is the fragment's")
        else:
            # Plain shared stores (fp32, e4m3): each thread writes its own values at their coordinates.
            assert not found["destination_differs"], (case, found)
