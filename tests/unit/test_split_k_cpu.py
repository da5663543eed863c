"""A split-K plan's host side (tilekiln/_torch/run.py, _split_k), run on host tensors through the
stand-in library of tests/emulated.py: the K slices' fp32 partial products land in the workspace at
the strides of the plan's sliced problem, and their fp32 sum, rounded once, is the result, into a
new tensor or a caller's out= (an out whose rows end short of 16 bytes included, whose columns past
N stay as they were). This test found the sum rounding every plane to bf16 first: ``torch.sum``
into a bf16 ``out`` reduces in bf16's type."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from tests.emulated import host_bundle
from tests.records import kernel_record
from tilekiln._torch import run
from tilekiln.spec import MAX_EXTENT, Contract

PARTIAL = "gemm_tn_f32_128x64"  # slices of at least splitk.MIN_SLICE_K (512): K 4096 splits up to 8 ways


@pytest.fixture
def host(tmp_path, monkeypatch):
    record = kernel_record(0, PARTIAL, (128, 64, 64), dtypes=("bf16", "bf16", "f32", "f32"))
    # 16-byte strides in each operand's own elements, as the catalog's partial kernels state them.
    return host_bundle(tmp_path, monkeypatch, (dataclasses.replace(record, contract=Contract(16, (8, 8, 4), MAX_EXTENT)),))


def _partials(a: torch.Tensor, b: torch.Tensor):
    """A split plan's partial products: one per K slice of the plan's sliced problem."""
    def product(plan):
        ks = plan.run.k
        return torch.stack([a[:, s * ks:(s + 1) * ks].float() @ b[s * ks:(s + 1) * ks].float()
                            for s in range(plan.split)])
    return product


@pytest.mark.parametrize("split", [2, 4, 8])
def test_the_planes_are_summed_in_fp32_and_rounded_once(host, split):
    gen = torch.Generator().manual_seed(split)
    a = torch.randn(5, 4096, generator=gen).to(torch.bfloat16)
    w = torch.randn(96, 4096, generator=gen).to(torch.bfloat16)
    lib = host.library(_partials(a, w.t()))
    got = run.run_gemm(host.bundle, a, w.t(), None, None, f"{PARTIAL}/splitk{split}")
    assert len(lib.targets) == 1 and got.dtype == torch.bfloat16 and got.shape == (5, 96)
    ks = 4096 // split
    want = torch.stack([a[:, s * ks:(s + 1) * ks].float() @ w[:, s * ks:(s + 1) * ks].float().t()
                        for s in range(split)]).sum(0)  # the planes' fp32 sum, as the workspace holds them
    torch.testing.assert_close(got.float(), want.to(torch.bfloat16).float(), rtol=0, atol=0)
    torch.testing.assert_close(got.float(), a.float() @ w.float().t(), rtol=2e-2, atol=2e-2)


def test_a_split_into_an_out_whose_rows_end_short_of_16_bytes_keeps_its_columns_past_n(host):
    gen = torch.Generator().manual_seed(9)
    a = torch.randn(3, 2048, generator=gen).to(torch.bfloat16)
    w = torch.randn(100, 2048, generator=gen).to(torch.bfloat16)
    buffer = torch.full((3, 136), 7.0, dtype=torch.bfloat16)
    out = buffer[:, :100]
    host.library(_partials(a, w.t()))
    assert run.run_gemm(host.bundle, a, w.t(), out, None, f"{PARTIAL}/splitk4") is out
    assert (buffer[:, 100:] == 7.0).all()
    torch.testing.assert_close(out.float(), a.float() @ w.float().t(), rtol=2e-2, atol=2e-2)
