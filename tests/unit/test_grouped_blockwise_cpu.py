"""Blockwise fp8 grouped GEMM without a GPU (issue 34): the checks of a grouped call's blockwise
scales in both layouts (accepted layouts and the strides they give the plan block; every refusal
names its argument), the same checks through tilekiln.grouped_gemm and grouped_gemm_masked, and the
selection that runs a blockwise call only on a blockwise grouped kernel."""

from __future__ import annotations

import re

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

import tilekiln
from tilekiln.blockwise import check_grouped_scales
from tests.unit.test_grouped_epilogues_cpu import FP8, FP8_ROWWISE, FP8_ROWWISE_GATED, bundle_of, grouped

E4M3 = torch.float8_e4m3fn
FP8_BLOCKWISE = grouped(6, (128, 128, 128), dtype="e4m3", scaling="blockwise")
MASKED_FP8 = grouped(7, (64, 128, 128), family="grouped_masked", dtype="e4m3", schedule="pingpong")
MASKED_BLOCKWISE = grouped(8, (64, 128, 128), family="grouped_masked", dtype="e4m3", schedule="pingpong",
                           scaling="blockwise")


def _contiguous(m=300, n=200, k=384, groups=3, device="cpu"):
    """a (total_M, K), b (G, K, N) K-major, scale_a (total_M, K/128) M-major, scale_b (G, N/128, K/128)."""
    a = torch.zeros(m, k, dtype=E4M3, device=device)
    b = torch.zeros(groups, n, k, dtype=E4M3, device=device).transpose(1, 2)
    sa = torch.ones(k // 128, m, device=device).t()
    sb = torch.ones(groups, -(-n // 128), k // 128, device=device)
    return a, b, sa, sb


def _masked(m_max=40, n=200, k=384, groups=3, device="cpu"):
    """a (G, M_max, K), scale_a (G, M_max, K/128) as quantize_fp8_blockwise of a.view(-1, K) viewed back."""
    a = torch.zeros(groups, m_max, k, dtype=E4M3, device=device)
    b = torch.zeros(groups, n, k, dtype=E4M3, device=device).transpose(1, 2)
    sa = torch.ones(k // 128, groups * m_max, device=device).t().view(groups, m_max, k // 128)
    sb = torch.ones(groups, -(-n // 128), k // 128, device=device)
    return a, b, sa, sb


def test_the_documented_layouts_are_accepted_with_their_strides():
    a, b, sa, sb = _contiguous()
    # scale_a: lead = stride along K blocks, batch unused (lead x K blocks); scale_b: N blocks, groups.
    assert check_grouped_scales(a, b, sa, sb, masked=False) == (300, 900, 3, 6)
    a, b, sa, sb = _masked()
    assert sa.stride() == (40, 1, 120)
    assert check_grouped_scales(a, b, sa, sb, masked=True) == (120, 40, 3, 6)


def test_quantize_fp8_blockwise_gives_both_layouts():
    x = torch.randn(3 * 40, 256).to(torch.bfloat16)
    _, sa = tilekiln.quantize_fp8_blockwise(x, (1, 128))
    ws = [tilekiln.quantize_fp8_blockwise(torch.randn(200, 256), (128, 128)) for _ in range(3)]
    w8, sb = torch.stack([w for w, _ in ws]), torch.stack([s for _, s in ws])
    a = torch.zeros(120, 256, dtype=E4M3)
    assert check_grouped_scales(a, w8.transpose(1, 2), sa, sb, masked=False)[0] == 120
    masked_sa = sa.view(3, 40, 2)
    assert check_grouped_scales(a.view(3, 40, 256), w8.transpose(1, 2), masked_sa, sb, masked=True)[:2] == (120, 40)


@pytest.mark.parametrize("masked, change, error, text", [
    (False, lambda a, b, sa, sb: (a, b, sa.contiguous(), sb), ValueError,
     "scale_a: expected a float32 tensor (total_M, K/128) = (300, 3) M-major (stride (1, s))"),
    (False, lambda a, b, sa, sb: (a, b, sa.double(), sb), ValueError, "got dtype torch.float64"),
    (False, lambda a, b, sa, sb: (a, b, sa[:299], sb), ValueError, "got shape [299, 3]"),
    (False, lambda a, b, sa, sb: (a, b, sa, sb[:2]), ValueError,
     "scale_b: expected a float32 tensor (G, ceil(N/128), K/128) = (3, 2, 3) with K/128 contiguous"),
    (False, lambda a, b, sa, sb: (a, b, sa, sb.transpose(1, 2).contiguous().transpose(1, 2)), ValueError,
     "scale_b: expected"),
    (False, lambda a, b, sa, sb: (a, b, sa, sb.to("meta")), ValueError, "got device meta"),
    (False, lambda a, b, sa, sb: (a, b, None, sb), TypeError, "scale_a: expected a float32 tensor"),
    (False, lambda a, b, sa, sb: (a[:, :320], b[:, :320], sa, sb), ValueError, "a: K = 320 is not a multiple of 128"),
    (True, lambda a, b, sa, sb: (a, b, sa.contiguous(), sb), ValueError,
     "scale_a: expected a float32 tensor (G, M_max, K/128) = (3, 40, 3) with M_max contiguous"),
    (True, lambda a, b, sa, sb: (a, b, sa[:, :39], sb), ValueError, "got shape [3, 39, 3]"),
    (True, lambda a, b, sa, sb: (a, b, sa.reshape(120, 3), sb), ValueError, "got shape [120, 3]"),
])
def test_wrong_scales_are_refused_naming_the_argument(masked, change, error, text):
    operands = _masked() if masked else _contiguous()
    with pytest.raises(error, match=re.escape(text)):
        check_grouped_scales(*change(*operands), masked=masked)


def test_the_calls_check_the_scales_before_choosing_a_kernel(tmp_path):
    bundle = bundle_of(tmp_path, FP8_BLOCKWISE, MASKED_BLOCKWISE)
    with FakeTensorMode():
        a, b, sa, sb = _contiguous(device="cuda")
        rows = torch.empty(3, dtype=torch.int32, device="cuda")
        with pytest.raises(ValueError, match=re.escape("scale_a: expected a float32 tensor (total_M, K/128)")):
            tilekiln.grouped_gemm(a, b, rows, scale_a=torch.ones(300, 3, device="cuda"), scale_b=sb,
                                  scale_format="blockwise", bundle=bundle)
        with pytest.raises(ValueError, match=re.escape("scale_b: expected a float32 tensor (G, ceil(N/128), K/128)")):
            tilekiln.grouped_gemm(a, b, rows, scale_a=sa, scale_b=torch.ones(3, 1, 3, device="cuda"),
                                  scale_format="blockwise", bundle=bundle)
        a, b, sa, sb = _masked(device="cuda")
        with pytest.raises(ValueError, match=re.escape("scale_a: expected a float32 tensor (G, M_max, K/128)")):
            tilekiln.grouped_gemm_masked(a, b, rows, scale_a=torch.ones(3, 40, 3, device="cuda"), scale_b=sb,
                                         scale_format="blockwise", bundle=bundle)
        with pytest.raises(TypeError, match="scale_a: scales are for 8-bit float inputs"):
            tilekiln.grouped_gemm_masked(a.to(torch.bfloat16), b.to(torch.bfloat16), rows, scale_a=sa, scale_b=sb,
                                         scale_format="blockwise", bundle=bundle)


def test_a_blockwise_call_runs_only_on_a_blockwise_grouped_kernel(tmp_path):
    with FakeTensorMode():
        a, b, _, _ = _contiguous(m=4096, n=1024, k=512, groups=8, device="cuda")
        rows = torch.empty(8, dtype=torch.int32, device="cuda")
        both = bundle_of(tmp_path / "both", FP8, FP8_ROWWISE, FP8_BLOCKWISE)
        assert tilekiln.explain(a, b, offs=rows, scale_format="blockwise", bundle=both).kernel.id == FP8_BLOCKWISE.id
        # Per-tensor and row-wise calls never run the blockwise kernel.
        assert tilekiln.explain(a, b, offs=rows, bundle=both).kernel.id == FP8.id
        assert tilekiln.explain(a, b, offs=rows, scale_format="rowwise", bundle=both).kernel.id == FP8_ROWWISE.id
        # Without one, nothing runs it (torch cannot promote per K block after a kernel).
        assert tilekiln.explain(a, b, offs=rows, scale_format="blockwise",
                                bundle=bundle_of(tmp_path / "fp8", FP8, FP8_ROWWISE)).kernel is None
        am, bm, _, _ = _masked(m_max=64, n=1024, k=512, groups=8, device="cuda")
        masked = bundle_of(tmp_path / "masked", MASKED_FP8, MASKED_BLOCKWISE, FP8_BLOCKWISE)
        assert tilekiln.explain(am, bm, masked_m=rows, scale_format="blockwise",
                                bundle=masked).kernel.id == MASKED_BLOCKWISE.id
        assert tilekiln.explain(am, bm, masked_m=rows, bundle=masked).kernel.id == MASKED_FP8.id


BLOCKWISE_GATED = grouped(9, (128, 128, 128), dtype="e4m3", scaling="blockwise", activation="swiglu")
MASKED_BLOCKWISE_GATED = grouped(10, (64, 128, 128), family="grouped_masked", dtype="e4m3", schedule="pingpong",
                                 scaling="blockwise", activation="swiglu")


def test_a_blockwise_gate_up_runs_on_a_blockwise_swiglu_kernel_or_pairs_in_torch(tmp_path):
    """The expert MLP's gate_up with DeepSeek-V3 scales: the fused kernel where the bundle has one, the
    blockwise GEMM with the pairing left to torch where not, never a per-tensor or row-wise kernel."""
    with FakeTensorMode():
        a, b, _, _ = _contiguous(m=4096, n=1024, k=512, groups=8, device="cuda")
        rows = torch.empty(8, dtype=torch.int32, device="cuda")
        fused = bundle_of(tmp_path / "fused", FP8_BLOCKWISE, BLOCKWISE_GATED, FP8_ROWWISE_GATED)
        choice = tilekiln.explain(a, b, offs=rows, scale_format="blockwise", activation="swiglu", bundle=fused)
        assert choice.kernel.id == BLOCKWISE_GATED.id and not choice.notes
        plain = bundle_of(tmp_path / "plain", FP8_BLOCKWISE, FP8_ROWWISE_GATED)
        choice = tilekiln.explain(a, b, offs=rows, scale_format="blockwise", activation="swiglu", bundle=plain)
        assert choice.kernel.id == FP8_BLOCKWISE.id and "torch applies it" in choice.notes[0]
        am, bm, _, _ = _masked(m_max=64, n=1024, k=512, groups=8, device="cuda")
        masked = bundle_of(tmp_path / "masked", MASKED_BLOCKWISE, MASKED_BLOCKWISE_GATED)
        assert tilekiln.explain(am, bm, masked_m=rows, scale_format="blockwise", activation="swiglu",
                                bundle=masked).kernel.id == MASKED_BLOCKWISE_GATED.id
        # The gated kernel never runs the plain call.
        assert tilekiln.explain(am, bm, masked_m=rows, scale_format="blockwise",
                                bundle=masked).kernel.id == MASKED_BLOCKWISE.id


def test_grouped_swiglu_checks_blockwise_scales_of_the_interleaved_weight(tmp_path):
    """scale_b's blocks run along w_gate_up's 2I rows: scales of the I-row gate (or up) weight alone
    are refused naming scale_b, before any kernel is chosen."""
    bundle = bundle_of(tmp_path, BLOCKWISE_GATED, MASKED_BLOCKWISE_GATED)
    with FakeTensorMode():
        a, b, sa, sb = _contiguous(m=300, n=512, k=384, groups=3, device="cuda")
        w_gate_up = b.transpose(1, 2)  # (G, 2I, K)
        rows = torch.empty(3, dtype=torch.int32, device="cuda")
        half = torch.ones(3, 2, 3, device="cuda")  # (G, I/128, K/128)
        with pytest.raises(ValueError, match=re.escape("scale_b: expected a float32 tensor (G, ceil(N/128), K/128)")):
            tilekiln.grouped_swiglu(a, w_gate_up, rows, scale_a=sa, scale_b=half, scale_format="blockwise",
                                    bundle=bundle)
        am, bm, sam, sbm = _masked(m_max=40, n=512, k=384, groups=3, device="cuda")
        with pytest.raises(ValueError, match=re.escape("scale_b: expected a float32 tensor (G, ceil(N/128), K/128)")):
            tilekiln.grouped_swiglu_masked(am, bm.transpose(1, 2), rows, scale_a=sam, scale_b=half,
                                           scale_format="blockwise", bundle=bundle)


@pytest.mark.parametrize("masked", [False, True])
def test_blockwise_scales_are_read_from_their_shapes_as_a_dense_call_reads_them(tmp_path, monkeypatch, masked):
    """Without scale_format, (total_M, K/128) (masked: (G, M_max, K/128)) and (G, ceil(N/128), K/128)
    scales are blockwise, as scaled_gemm reads (M, K/128) and (ceil(N/128), K/128) ones: the call runs
    the blockwise kernel (its pointer checks too), where a row-wise reading refused scale_a's shape."""
    from tests.emulated import host_bundle
    from tilekiln._torch import api

    from tilekiln._torch import run_grouped

    host = host_bundle(tmp_path, monkeypatch, (FP8_ROWWISE_GATED, BLOCKWISE_GATED, MASKED_BLOCKWISE_GATED))
    checked = []
    monkeypatch.setattr(run_grouped, "check_float_pointers", lambda **scales: checked.append(scales))
    a, b, sa, sb = (_masked if masked else _contiguous)(n=256, k=384, groups=3)
    rows = torch.tensor([40, 0, 7] if masked else [100, 100, 300], dtype=torch.int32)
    i = b.shape[-1] // 2
    want = torch.randn(*a.shape[:-1], i)
    host.library(lambda plan: want)
    for _ in range(2):  # planned, then from the plan cache
        out = api.grouped_swiglu(host.bundle, a, b.transpose(1, 2), rows, sa, sb, None, None, masked=masked)
    (plan,) = host.plans.values()
    assert plan.kernel_id == (MASKED_BLOCKWISE_GATED if masked else BLOCKWISE_GATED).id and not plan.unfused
    assert ("scaling", "blockwise") in plan.problem.requested
    assert out.shape == (*a.shape[:-1], i)
    if not masked:
        torch.testing.assert_close(out.float(), want.to(torch.bfloat16).float())
    # The scales' pointer check runs on every call, as on the explicit path.
    assert len(checked) == 2 and all(c["scale_a"] is sa and c["scale_b"] is sb for c in checked)


def test_one_element_scales_stay_per_tensor_whatever_their_shape():
    """One group, one row, K 128, N up to 128: (1, 1) and (1, 1, 1) scales have the blockwise shapes,
    but one element each is a per-tensor scale, as a dense call reads it."""
    from tilekiln._torch.scales import grouped_blockwise_shapes

    a, b = torch.zeros(1, 128, dtype=E4M3), torch.zeros(1, 100, 128, dtype=E4M3).transpose(1, 2)
    assert not grouped_blockwise_shapes(a, b, torch.ones(1, 1), torch.ones(1, 1, 1))
    assert not grouped_blockwise_shapes(a.view(1, 1, 128), b, torch.ones(1, 1, 1), torch.ones(1, 1, 1))
    a, b, sa, sb = _contiguous(n=256, k=384, groups=3)
    assert grouped_blockwise_shapes(a, b, sa, sb)
    assert not grouped_blockwise_shapes(a, b, torch.ones(300), torch.ones(3, 256))  # row-wise
