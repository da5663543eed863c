"""The out= staging of the torch path (tilekiln/_torch/results.py, stage_for), run end to end on
host tensors through a stand-in library (tests/emulated.py) whose launches store the product at the
strides of the plan the call made, every row in whole 16-byte chunks as a TMA store writes it. An
out= whose rows end short of 16 bytes (N = 100 bf16 columns in rows of 136) must keep its columns
past N, get every element, and cost one launch; an out= no kernel stores (rows not 16 bytes apart,
column-major) gets the product through a result of tilekiln's (tilekiln/_torch/run.py,
through_result). The GPU suite found a staged call that staged its own stage without end and a
grouped one whose plan's strides were not its stage's; these run the same paths without a GPU."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from tests.emulated import host_bundle
from tests.records import kernel_record
from tilekiln._torch import run, run_grouped

N, WIDTH = 100, 136  # 200-byte rows inside 272-byte ones: the chunk of column 99 reaches column 103
SENTINEL = 7.0


def _grouped(index: int, family: str, kernel_id: str, tile: tuple[int, int, int]):
    record = kernel_record(index, kernel_id, tile)
    return dataclasses.replace(record, config=dataclasses.replace(record.config, family=family))


@pytest.fixture
def host(tmp_path, monkeypatch):
    """A bf16 and an e4m3 tn kernel and a contiguous and a masked grouped bf16 kernel, on host tensors."""
    return host_bundle(tmp_path, monkeypatch, (
        kernel_record(0, "gemm_tn_128x128", (128, 128, 64)),
        _grouped(1, "grouped_masked", "grouped_masked_tn_64x128", (64, 128, 64)),
        kernel_record(2, "gemm_e4m3_tn_128x128", (128, 128, 128), dtypes=("e4m3", "e4m3", "f32", "bf16")),
        _grouped(3, "grouped", "grouped_tn_128x128", (128, 128, 64))))


def _view(*lead):
    """A NaN-filled (*lead, N) column slice of a (*lead, WIDTH) buffer whose other columns hold SENTINEL."""
    buffer = torch.full((*lead, WIDTH), float("nan"), dtype=torch.bfloat16)
    buffer[..., N:] = SENTINEL
    return buffer, buffer[..., :N]


def _kept(buffer) -> bool:
    return bool((buffer[..., N:] == SENTINEL).all())


def test_a_dense_out_whose_rows_end_short_of_16_bytes_keeps_its_columns_past_n(host):
    gen = torch.Generator().manual_seed(5)
    a = torch.randn(40, 64, generator=gen).to(torch.bfloat16)
    w = torch.randn(N, 64, generator=gen).to(torch.bfloat16)
    want = a.float() @ w.float().t()
    lib = host.library(lambda plan: want)
    buffer, out = _view(40)
    assert run.run_gemm(host.bundle, a, w.t(), out, None) is out
    assert len(lib.targets) == 1
    assert _kept(buffer), "the chunk past column 99 reached the caller's columns"
    torch.testing.assert_close(out.float(), want.to(torch.bfloat16).float())


@pytest.mark.parametrize("b_batched", [False, True], ids=["folded", "batched"])
def test_a_batched_out_whose_rows_end_short_of_16_bytes_keeps_its_columns_past_n(host, b_batched):
    """A 3-D a against one b (the batch folded into one matrix's rows) or a b per batch entry."""
    gen = torch.Generator().manual_seed(10)
    a = torch.randn(2, 24, 64, generator=gen).to(torch.bfloat16)
    w = torch.randn(*((2,) if b_batched else ()), N, 64, generator=gen).to(torch.bfloat16)
    want = a.float() @ w.float().transpose(-1, -2)
    lib = host.library(lambda plan: want)
    buffer, out = _view(2, 24)
    assert run.run_gemm(host.bundle, a, w.transpose(-1, -2), out, None) is out
    (plan,) = host.plans.values()
    assert (plan.problem.fold_batch, plan.problem.batch) == ((False, 2) if b_batched else (True, 1))
    assert len(lib.targets) == 1
    assert _kept(buffer), "the chunk past column 99 reached the caller's columns"
    torch.testing.assert_close(out.float(), want.to(torch.bfloat16).float())


def test_a_scaled_out_whose_rows_end_short_of_16_bytes_keeps_its_columns_past_n(host, monkeypatch):
    # Host scales are on device -1, not the plan's 0; the scales' checks have tests of their own.
    monkeypatch.setattr(run, "check_tensor_scale", lambda name, scale, device: None)
    gen = torch.Generator().manual_seed(7)
    a = torch.randn(24, 128, generator=gen).to(torch.float8_e4m3fn)
    w = torch.randn(N, 128, generator=gen).to(torch.float8_e4m3fn)
    scale_a, scale_b = torch.tensor([0.5]), torch.tensor([2.0])
    want = a.float() @ w.float().t()  # the scales multiply to 1
    lib = host.library(lambda plan: want)
    buffer, out = _view(24)
    assert run.run_scaled_gemm(host.bundle, a, w.t(), scale_a, scale_b, None, out, None, None) is out
    assert len(lib.targets) == 1
    assert _kept(buffer), "the chunk past column 99 reached the caller's columns"
    torch.testing.assert_close(out.float(), want.to(torch.bfloat16).float())


def test_an_epilogue_no_kernel_fuses_is_applied_by_torch_into_the_out_and_keeps_its_columns_past_n(host):
    """The bundle's kernels add no bias: the GEMM runs into tilekiln's own result, then torch adds the
    bias and applies the activation in fp32 into out, one rounding."""
    from tilekiln.problem import requested_epilogue

    gen = torch.Generator().manual_seed(11)
    a = torch.randn(16, 64, generator=gen).to(torch.bfloat16)
    w = torch.randn(N, 64, generator=gen).to(torch.bfloat16)
    bias = torch.randn(N, generator=gen)
    product = a.float() @ w.float().t()
    lib = host.library(lambda plan: product)
    buffer, out = _view(16)
    requested = requested_epilogue(bias="f32", activation="relu")
    assert run.run_gemm(host.bundle, a, w.t(), out, None, None, requested, bias) is out
    assert len(lib.targets) == 1 and lib.targets != [out.data_ptr()]
    assert _kept(buffer), "a column past N was written"
    want = torch.relu(product.to(torch.bfloat16).float() + bias)
    torch.testing.assert_close(out.float(), want.to(torch.bfloat16).float())


def test_an_out_whose_rows_end_on_16_bytes_is_written_in_place(host):
    a = torch.randn(8, 64).to(torch.bfloat16)
    w = torch.randn(96, 64).to(torch.bfloat16)
    want = a.float() @ w.float().t()
    lib = host.library(lambda plan: want)
    out = torch.empty(8, 96, dtype=torch.bfloat16)
    run.run_gemm(host.bundle, a, w.t(), out, None)
    assert lib.targets == [out.data_ptr()], "a row of 192 bytes needs no stage"
    torch.testing.assert_close(out.float(), want.to(torch.bfloat16).float())


def test_a_contiguous_grouped_out_keeps_the_columns_past_n(host):
    rows = [3, 0, 9, 4]
    offs = torch.tensor(rows, dtype=torch.int32).cumsum(0).to(torch.int32)
    gen = torch.Generator().manual_seed(8)
    a = torch.randn(sum(rows), 64, generator=gen).to(torch.bfloat16)
    w = torch.randn(len(rows), N, 64, generator=gen).to(torch.bfloat16)
    starts = [0, *offs.tolist()[:-1]]
    want = torch.cat([a[s:s + r].float() @ w[g].float().t() for g, (s, r) in enumerate(zip(starts, rows))])
    lib = host.library(lambda plan: want)
    buffer, out = _view(sum(rows))
    assert run_grouped.run_grouped_gemm(host.bundle, a, w.transpose(1, 2), offs, None, None, out, None) is out
    assert len(lib.targets) == 1
    assert _kept(buffer), "the chunk past column 99 reached the caller's columns"
    torch.testing.assert_close(out.float(), want.to(torch.bfloat16).float())


def test_a_masked_grouped_out_keeps_the_rows_no_group_owns_and_the_columns_past_n(host):
    groups, slots, k = 3, 8, 64
    counts = torch.tensor([5, 0, 8], dtype=torch.int32)
    gen = torch.Generator().manual_seed(6)
    a = torch.randn(groups, slots, k, generator=gen).to(torch.bfloat16)
    w = torch.randn(groups, N, k, generator=gen).to(torch.bfloat16)
    want = a.float() @ w.float().transpose(1, 2)
    lib = host.library(lambda plan: want)
    buffer, out = _view(groups, slots)
    assert run_grouped.run_grouped_gemm(host.bundle, a, w.transpose(1, 2), counts, None, None, out, None,
                                        masked=True) is out
    assert len(lib.targets) == 1
    assert _kept(buffer), "the chunk past column 99 reached the caller's columns"
    for g, rows in enumerate(counts.tolist()):
        torch.testing.assert_close(out[g, :rows].float(), want[g, :rows].to(torch.bfloat16).float())
        assert out[g, rows:].isnan().all(), f"group {g}: a row it does not own was written"


@pytest.mark.parametrize("layout", ["contiguous", "column-major"])
def test_an_out_whose_rows_no_kernel_stores_is_written_from_a_result_of_tilekilns(host, layout):
    """torch.matmul takes any out=: one whose rows are not 16 bytes apart (100 bf16 columns back to
    back) or that is column-major gets the product through a result tilekiln allocates, copied."""
    gen = torch.Generator().manual_seed(12)
    a = torch.randn(40, 64, generator=gen).to(torch.bfloat16)
    w = torch.randn(N, 64, generator=gen).to(torch.bfloat16)
    want = a.float() @ w.float().t()
    lib = host.library(lambda plan: want)
    out = torch.full((40, N), float("nan"), dtype=torch.bfloat16)
    if layout == "column-major":
        out = torch.full((N, 40), float("nan"), dtype=torch.bfloat16).t()
    for _ in range(2):  # planned, then from the plan cache
        assert run.run_gemm(host.bundle, a, w.t(), out, None) is out
        torch.testing.assert_close(out.float(), want.to(torch.bfloat16).float())
    assert len(lib.targets) == 2 and out.data_ptr() not in lib.targets


def test_a_residual_read_at_such_an_outs_strides_is_added_by_torch(host):
    """A residual the caller checked at out's strides (linear's residual=out in place): the kernel could
    not read it there, so torch adds it to tilekiln's result, scaled by beta, before writing out."""
    from tilekiln.problem import requested_epilogue

    gen = torch.Generator().manual_seed(13)
    a = torch.randn(8, 64, generator=gen).to(torch.bfloat16)
    w = torch.randn(N, 64, generator=gen).to(torch.bfloat16)
    product = a.float() @ w.float().t()
    out = torch.randn(8, N, generator=gen).to(torch.bfloat16)  # also the residual
    residual = out.clone()
    host.library(lambda plan: product)
    run.run_gemm(host.bundle, a, w.t(), out, None, None, requested_epilogue(residual="add"), None, out, (1.0, 0.5))
    want = product.to(torch.bfloat16).float() + 0.5 * residual.float()
    torch.testing.assert_close(out.float(), want.to(torch.bfloat16).float())


def test_an_out_of_the_wrong_shape_or_dtype_is_refused_as_before(host):
    a = torch.randn(8, 64).to(torch.bfloat16)
    w = torch.randn(N, 64).to(torch.bfloat16)
    host.library(lambda plan: a.float() @ w.float().t())
    with pytest.raises(ValueError, match=r"out: shape \[8, 99\]"):
        run.run_gemm(host.bundle, a, w.t(), torch.empty(8, 99, dtype=torch.bfloat16), None)
    with pytest.raises(TypeError, match="out: dtype f16"):
        run.run_gemm(host.bundle, a, w.t(), torch.empty(8, N, dtype=torch.float16), None)


def test_a_scaled_out_whose_rows_no_kernel_stores_is_written_from_a_result_of_tilekilns(host, monkeypatch):
    monkeypatch.setattr(run, "check_tensor_scale", lambda name, scale, device: None)  # host scales, as above
    gen = torch.Generator().manual_seed(14)
    a = torch.randn(24, 128, generator=gen).to(torch.float8_e4m3fn)
    w = torch.randn(N, 128, generator=gen).to(torch.float8_e4m3fn)
    one = torch.tensor([1.0])
    want = a.float() @ w.float().t()
    lib = host.library(lambda plan: want)
    out = torch.full((24, N), float("nan"), dtype=torch.bfloat16)
    assert run.run_scaled_gemm(host.bundle, a, w.t(), one, one, None, out, None, None) is out
    assert len(lib.targets) == 1 and lib.targets[0] != out.data_ptr()
    torch.testing.assert_close(out.float(), want.to(torch.bfloat16).float())


def test_a_grouped_out_whose_rows_no_kernel_stores_is_refused_with_the_padding_hint(host):
    offs = torch.tensor([3, 8], dtype=torch.int32)
    a = torch.randn(8, 64).to(torch.bfloat16)
    w = torch.randn(2, N, 64).to(torch.bfloat16)
    host.library(lambda plan: a.float())
    with pytest.raises(ValueError, match=r"(?s)alignment: out leading stride 100 .*hint: .*\[:, :N\]"):
        run_grouped.run_grouped_gemm(host.bundle, a, w.transpose(1, 2), offs, None, None,
                                     torch.empty(8, N, dtype=torch.bfloat16), None)


def test_linear_into_such_an_out_that_is_also_its_residual(host):
    """linear(x, w, residual=out, out=out) with 100 bf16 columns back to back: the residual is read
    before out is written, and added once to the product."""
    from tilekiln._torch.api import linear

    gen = torch.Generator().manual_seed(15)
    x = torch.randn(2, 6, 64, generator=gen).to(torch.bfloat16)
    w = torch.randn(N, 64, generator=gen).to(torch.bfloat16)
    out = torch.randn(2, 6, N, generator=gen).to(torch.bfloat16)
    before = out.clone()
    product = x.reshape(12, 64).float() @ w.float().t()
    host.library(lambda plan: product)
    assert linear(host.bundle, x, w, None, None, out, out) is out
    want = (product.to(torch.bfloat16).float() + before.reshape(12, N).float()).reshape(2, 6, N)
    torch.testing.assert_close(out.float(), want.to(torch.bfloat16).float())
