"""A blockwise split-K plan's host side, run on host tensors through the stand-in library of
tests/emulated.py: the stand-in reads each K slice's operands and scales as the kernel would, from
the plan block's strides (slice s is batch entry s), so a split whose scale batch strides did not
move each slice onto its own scale blocks fails; the planes' fp32 sum, rounded once, is the result.
tilekiln/splitk.py, ``sliced`` and ``sliced_scale_strides``."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from tests.emulated import host_bundle
from tests.records import kernel_record
from tilekiln._native import PLAN
from tilekiln._tensors import Operand
from tilekiln._torch import run
from tilekiln.blockwise import dequantize, quantize_fp8_blockwise
from tilekiln.problem import make_problem
from tilekiln.spec import FAMILIES, MAX_EXTENT, Contract
from tilekiln.splitk import sliced, sliced_scale_strides

PARTIAL = "gemm_tn_e4m3_f32_64x16_blockwise"
BLOCKWISE = (("scaling", "blockwise"),)
ROWS, BLOCKS = (1, 128), (128, 128)


@pytest.fixture
def host(tmp_path, monkeypatch):
    record = kernel_record(0, PARTIAL, (64, 16, 128), dtypes=("e4m3", "e4m3", "f32", "f32"), swap_ab=True,
                           scaling="blockwise")
    # 16-byte strides in each operand's own elements.
    return host_bundle(tmp_path, monkeypatch, (dataclasses.replace(record, contract=Contract(16, (16, 16, 4), MAX_EXTENT)),))


def _operands(m: int, n: int, k: int, seed: int):
    """fp8 operands and their blockwise scales; the weight's 128x128 blocks differ in magnitude by up
    to 2^12, so a slice that read another slice's B scales would be far off."""
    gen = torch.Generator().manual_seed(seed)
    a8, sa = quantize_fp8_blockwise(torch.randn(m, k, generator=gen), ROWS)
    blocks = 2.0 ** torch.randint(-6, 7, (-(-n // 128), k // 128), generator=gen)
    w = torch.randn(n, k, generator=gen) * blocks.repeat_interleave(128, 0)[:n].repeat_interleave(128, 1)
    w8, sb = quantize_fp8_blockwise(w, BLOCKS)
    return a8, w8, sa, sb


def _kernel_reads(a8, w8, sa, sb):
    """The stand-in's product: each batch entry's partial as the kernel computes it, its operands and
    scales read at the plan block's strides (a and the weight K-major, scale_a M-major, scale_b with
    its K blocks contiguous), each entry starting a batch stride further along."""
    def product(plan):
        strides = PLAN["gemm"].unpack(bytes(plan.block))
        (lead_a, batch_a, lead_b, batch_b, _, _, sa_kb, sa_l, sb_nb, sb_l) = strides[:10]
        run_problem = plan.run
        m, n, kc = run_problem.m, run_problem.n, run_problem.k
        kb = kc // 128
        flat_a, flat_w = a8.flatten().float(), w8.flatten().float()
        flat_sa, flat_sb = sa.as_strided((sa.numel(),), (1,)), sb.as_strided((sb.numel(),), (1,))
        planes = []
        for s in range(run_problem.batch):
            a_s = flat_a.as_strided((m, kc), (lead_a, 1), s * batch_a).double()
            w_s = flat_w.as_strided((n, kc), (lead_b, 1), s * batch_b).double()
            sa_s = flat_sa.as_strided((m, kb), (1, sa_kb), s * sa_l).double()
            sb_s = flat_sb.as_strided((-(-n // 128), kb), (sb_nb, 1), s * sb_l).double()
            a_deq = a_s * sa_s.repeat_interleave(128, 1)
            w_deq = w_s * sb_s.repeat_interleave(128, 0)[:n].repeat_interleave(128, 1)
            planes.append(a_deq @ w_deq.t())
        return torch.stack(planes).float()
    return product


@pytest.mark.parametrize("m, n, k, split", [(23, 576, 7168, 14), (5, 200, 4096, 4), (64, 136, 2048, 2)])
def test_each_slice_reads_its_own_scale_blocks(host, m, n, k, split):
    a8, w8, sa, sb = _operands(m, n, k, split)
    lib = host.library(_kernel_reads(a8, w8, sa, sb))
    got = run.run_scaled_gemm(host.bundle, a8, w8.t(), sa, sb, None, None, None, f"{PARTIAL}/splitk{split}",
                              BLOCKWISE)
    assert len(lib.targets) == 1 and got.dtype == torch.bfloat16 and got.shape == (m, n)
    ref = dequantize(a8, sa, ROWS) @ dequantize(w8, sb, BLOCKS).t()
    assert ((got.double() - ref).norm() / ref.norm()).item() < 1e-2


def test_the_scale_batch_strides_move_one_slice_along_k():
    family = FAMILIES["gemm"]
    # scale_a M-major (lead: its K-block stride 40), scale_b K-contiguous (lead: its block-row stride 56).
    assert sliced_scale_strides(family, (40, 40 * 56, 56, 56 * 5), 1024) == (40, 40 * 8, 56, 8)


def _problem(k: int, requested=BLOCKWISE):
    a = Operand("a", (8, k), (k, 1), "e4m3", 0x10000, 0, None)
    b = Operand("b", (k, 256), (1, k), "e4m3", 0x10000, 0, None)
    return make_problem(a, b, None, "bf16", requested)


def test_a_blockwise_split_starts_every_slice_on_a_scale_block():
    assert sliced(_problem(2560), 5).k == 512 and sliced(_problem(2560), 2).k == 1280
    assert sliced(_problem(2304), 3).k == 768
    # 576 = four and a half blocks: a per-tensor call splits so, a blockwise one does not.
    assert sliced(_problem(2304, ()), 4).k == 576
    assert sliced(_problem(2304), 4) is None


def test_an_epilogue_is_never_split_but_a_scale_format_is():
    assert sliced(_problem(4096), 4) is not None
    assert sliced(_problem(4096, (*BLOCKWISE, ("activation", "relu"))), 4) is None
    assert sliced(_problem(4096, (("bias", "f32"),)), 4) is None
