"""Row-wise fp8 scales and the fused residual without a GPU: the spec's arguments, the glue, the
runtime's checks of every call (errors name the argument), selection and explain, the torch
operators' fakes, and when linear hands its residual to the kernel."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

import tilekiln
from builder.compile.objfile import EntryPoints
from builder.package.link import LinkInput, render_glue
from tilekiln._torch.results import fusable_residual
from tilekiln._torch.scales import check_rowwise_scales, scale_format_of
from tilekiln.bundle import Bundle, DeviceInfo
from tilekiln.errors import NoKernelError
from tilekiln.problem import make_problem, requested_epilogue
from tilekiln.select import check_kernel, choose, choose_fused
from tilekiln.spec import FAMILIES, Scaling
from tilekiln._tensors import Operand
from tests.records import kernel_record, manifest, pick

E4M3, BF16 = torch.float8_e4m3fn, torch.bfloat16
FP8 = ("e4m3", "e4m3", "f32", "bf16")


def _op(name, shape, strides=None, dtype="bf16"):
    strides = strides or ((shape[1], 1) if len(shape) == 2 else (shape[1] * shape[2], shape[2], 1))
    return Operand(name, shape, strides, dtype, 0x1000, 0, None)


def fp8_problem(m, n, k, **asked):
    problem = make_problem(_op("a", (m, k), dtype="e4m3"), _op("b", (k, n), (1, k), dtype="e4m3"), None, "bf16")
    return replace(problem, requested=requested_epilogue(**asked))


def bf16_problem(m, n, k, **asked):
    problem = make_problem(_op("a", (m, k)), _op("b", (k, n), (1, k)), None)
    return replace(problem, requested=requested_epilogue(**asked))


TENSOR = kernel_record(0, "k0", (128, 256, 128), dtypes=FP8)
ROWWISE = kernel_record(1, "k1_rowwise", (128, 256, 128), dtypes=FP8, scaling="rowwise")
ROWWISE_BIAS = kernel_record(2, "k2_rowwise_biasbf16", (128, 256, 128), dtypes=FP8, scaling="rowwise", bias="bf16")
SWAPPED = kernel_record(3, "k3_swapab_rowwise", (64, 16, 256), dtypes=FP8, scaling="rowwise", swap_ab=True)
PLAIN = kernel_record(4, "k4", (128, 256, 64))
BIAS = kernel_record(5, "k5_biasbf16", (128, 256, 64), bias="bf16")
RESIDUAL = kernel_record(6, "k6_resadd", (128, 256, 64), residual="add")
BIAS_RESIDUAL = kernel_record(7, "k7_biasbf16_resadd", (128, 256, 64), bias="bf16", residual="add")
KERNELS = (TENSOR, ROWWISE, ROWWISE_BIAS, SWAPPED, PLAIN, BIAS, RESIDUAL, BIAS_RESIDUAL)


def fused(problem, kernels=KERNELS):
    choice, unfused = choose_fused(lambda p: choose(kernels, p, 132, pick()), problem)
    return (choice.kernel.id if choice.kernel else None), unfused


# -- the spec and the glue --------------------------------------------------------------------------


def test_the_gemm_family_passes_row_wise_scales_as_vectors_and_the_residual_after_the_bias():
    gemm = FAMILIES["gemm"]
    assert gemm.arguments == ("a", "b", "c", "scale_a", "scale_b", "bias", "residual", "scale_result",
                              "alpha", "beta", "resident_clusters", "stream")
    assert [(s.name, s.per) for s in gemm.scales] == [("scale_a", ("m",)), ("scale_b", ("n",))]
    assert [(x.name, x.like) for x in gemm.likes] == [("residual", "c")]
    # The residual shares C's plan strides: only the call block grows (and with scale_result, alpha
    # and beta).
    assert gemm.call_format == "<" + "Q" * 8 + "ff" + "Q" and gemm.plan_format == "<" + "q" * 10 + "i" * 8


def test_glue_builds_row_wise_scale_vectors_and_the_residual_from_cs_strides():
    entry = EntryPoints("p", "p_init", "p_load", "p_launch")
    text = render_glue("sm90a", [LinkInput("gemm_t", "gemm", b"", entry),
                                 LinkInput("gemm_r", "gemm", b"", entry, Scaling.ROWWISE),
                                 LinkInput("gemm_b", "gemm", b"", entry, Scaling.BLOCKWISE)])
    assert '{"gemm_t", 0, p_init, p_load, p_launch, 0, 0}' in text
    assert '{"gemm_r", 0, p_init, p_load, p_launch, 2, 0}' in text
    assert '{"gemm_b", 0, p_init, p_load, p_launch, 1, 0}' in text
    run = text.split("TK_EXPORT int tk_run_gemm(", 1)[1].split("\n}\n", 1)[0]
    assert "struct { void *data; int32_t shape[1]; } scale_a_rows = {call->scale_a, {plan->m}};" in run
    assert "struct { void *data; int32_t shape[1]; } scale_b_rows = {call->scale_b, {plan->n}};" in run
    assert ("tk_tensor_t residual = {call->residual, {plan->m, plan->n, plan->l}, "
            "{plan->c_stride[0], plan->c_stride[1]}};") in run
    launch = " ".join(run.split("void *args[13] = {", 1)[1].split("};")[0].split())
    assert launch.endswith("&bias, &residual, &scale_result, &alpha, &beta, &clusters, &stream, &result")
    call = text.split("} tk_call_gemm_t;")[0].rsplit("typedef struct {", 1)[1]
    assert call.index("*bias;") < call.index("*residual;") < call.index("*stream;")


# -- selection and explain ------------------------------------------------------------------------------


def test_row_wise_scales_run_only_on_a_rowwise_kernel_and_the_bias_fuses_after_them():
    assert check_kernel(TENSOR, fp8_problem(1024, 1024, 1024, scaling="rowwise")) == \
        "scaling: kernel computes tensor, the call asks for rowwise"
    assert check_kernel(ROWWISE, fp8_problem(1024, 1024, 1024)) == \
        "scaling: kernel computes rowwise, the call asks for tensor"
    assert fused(fp8_problem(4096, 4096, 4096, scaling="rowwise")) == ("k1_rowwise", ())
    assert fused(fp8_problem(4096, 4096, 4096, scaling="rowwise", bias="bf16")) == ("k2_rowwise_biasbf16", ())
    # Without a rowwise bias kernel, the rowwise kernel runs and torch adds the bias: the scaling
    # stays asked (only a kernel computes it), the bias is applied after.
    assert fused(fp8_problem(4096, 4096, 4096, scaling="rowwise", bias="bf16"), (TENSOR, ROWWISE)) == \
        ("k1_rowwise", (("bias", "bf16"),))
    # No rowwise kernel: nothing runs the call; the scaling is never dropped to a per-tensor kernel.
    kernel, _ = fused(fp8_problem(4096, 4096, 4096, scaling="rowwise"), (TENSOR,))
    assert kernel is None
    # Skinny M: the swapped kernel, whose MMA rows take scale_b.
    assert fused(fp8_problem(16, 4096, 4096, scaling="rowwise"), (ROWWISE, SWAPPED))[0] == "k3_swapab_rowwise"


def test_a_requested_residual_fuses_after_the_bias_or_is_left_to_torch():
    assert requested_epilogue(bias="bf16", residual="add", activation="none") == (("bias", "bf16"),
                                                                                 ("residual", "add"))
    assert check_kernel(RESIDUAL, bf16_problem(1024, 1024, 1024)) == \
        "residual: kernel computes add, the call asks for none"
    assert fused(bf16_problem(1024, 1024, 1024, residual="add")) == ("k6_resadd", ())
    assert fused(bf16_problem(1024, 1024, 1024, bias="bf16", residual="add")) == ("k7_biasbf16_resadd", ())
    # The residual comes after the activation: a bias kernel leaves torch a correct intermediate.
    assert fused(bf16_problem(1024, 1024, 1024, bias="bf16", activation="silu", residual="add")) == \
        ("k5_biasbf16", (("activation", "silu"), ("residual", "add")))
    assert fused(bf16_problem(1024, 1024, 1024, bias="bf16", residual="add"), (PLAIN, BIAS)) == \
        ("k5_biasbf16", (("residual", "add"),))


@pytest.fixture
def bundle(tmp_path: Path) -> Bundle:
    return Bundle(tmp_path, manifest(KERNELS), device_query=lambda ordinal: DeviceInfo(ordinal, (9, 0), 132, "NVIDIA H200", 143156))


def test_explain_says_whether_the_row_wise_scales_and_the_residual_are_fused(bundle):
    with FakeTensorMode():
        a8, w8 = torch.empty(4096, 4096, dtype=E4M3, device="cuda"), torch.empty(4096, 4096, dtype=E4M3,
                                                                                  device="cuda")
        choice = tilekiln.explain(a8, w8.t(), bundle=bundle, scale_format="rowwise")
        assert choice.kernel.id == "k1_rowwise" and not choice.notes
        choice = tilekiln.explain(a8, w8.t(), bundle=bundle, scale_format="rowwise", bias=BF16)
        assert choice.kernel.id == "k2_rowwise_biasbf16"
        x, w = torch.empty(1024, 1024, dtype=BF16, device="cuda"), torch.empty(1024, 1024, dtype=BF16, device="cuda")
        assert tilekiln.explain(x, w.t(), bundle=bundle, residual=True).kernel.id == "k6_resadd"
        choice = tilekiln.explain(x, w.t(), bundle=bundle, activation="silu", residual=True)
        assert choice.notes == (f"unfused: no kernel computes activation silu, residual add; torch applies it after "
                                f"{choice.label}",)


# -- the runtime's checks ---------------------------------------------------------------------------


def _rowwise(m=300, n=200, k=384):
    a = torch.zeros(m, k, dtype=E4M3)
    b = torch.zeros(n, k, dtype=E4M3).t()
    return a, b, torch.ones(m, 1), torch.ones(1, n)


def test_the_scale_format_is_read_from_the_scales_as_torch_scaled_mm_reads_them():
    a, b, sa, sb = _rowwise()  # M 300, K 384, N 200
    one = torch.ones(1)
    assert scale_format_of(None, a, b, sa, sb) == "rowwise"
    assert scale_format_of(None, a, b, one, one) == "tensor"
    assert scale_format_of(None, a, b, one, sb) == "rowwise"  # then refused: scale_a is not (M, 1)
    assert scale_format_of(None, a, b, 1.0, one) == "tensor"  # then refused: scale_a is not a tensor
    # (M, K/128) and (ceil(N/128), K/128): torch's 1x128 and 128x128 blocks.
    assert scale_format_of(None, a, b, torch.ones(300, 3), torch.ones(2, 3)) == "blockwise"
    assert scale_format_of(None, a, b, torch.ones(300, 3), torch.ones(3, 2)) == "rowwise"  # then refused
    assert scale_format_of(None, a[:, :300], b[:300], torch.ones(300, 3), torch.ones(2, 3)) == "rowwise"  # K % 128
    assert scale_format_of("blockwise", a, b, sa, sb) == "blockwise"
    with pytest.raises(ValueError, match="scale_format: 'rows' is not one of"):
        scale_format_of("rows", a, b, sa, sb)


def _literal(text):
    import re

    return re.escape(text)


@pytest.mark.parametrize("change, error, text", [
    (lambda a, b, sa, sb: (a, b, sa.double(), sb), ValueError,
     "scale_a: expected a float32 tensor (M, 1) = (300, 1), contiguous (one scale per row of a) for row-wise "
     "scaling, on the inputs' device; got dtype torch.float64 (convert with .float())"),
    (lambda a, b, sa, sb: (a, b, sa[:299], sb), ValueError, "scale_a: expected a float32 tensor (M, 1) = (300, 1)"),
    (lambda a, b, sa, sb: (a, b, torch.ones(1), sb), ValueError, "got shape [1]"),
    (lambda a, b, sa, sb: (a, b, sa, sb.t()), ValueError,
     "scale_b: expected a float32 tensor (1, N) = (1, 200), contiguous (one scale per column of b) for "
     "row-wise scaling, on the inputs' device; got shape [200, 1]"),
    (lambda a, b, sa, sb: (a, b, sa, torch.ones(2, 200)[:1, :].t().contiguous().t()), None, None),
    (lambda a, b, sa, sb: (a, b, sa, torch.ones(200, 2)[:, :1].t()), ValueError,
     "scale_b: expected a float32 tensor (1, N) = (1, 200), contiguous"),
    (lambda a, b, sa, sb: (a, b, sa, torch.ones(200, 2)[:, :1].t()), ValueError, "got strides [1, 2]"),
    (lambda a, b, sa, sb: (a, b, sa, sb.to(BF16)), ValueError, "scale_b: expected a float32 tensor"),
    (lambda a, b, sa, sb: (a, b, sa, sb.to("meta")), ValueError, "got device meta"),
    (lambda a, b, sa, sb: (a, b, 2.0, sb), TypeError, "scale_a: expected a float32 tensor (M, 1) = (300, 1), "
     "contiguous (one scale per row of a) for row-wise scaling, on the inputs' device; got float"),
    (lambda a, b, sa, sb: (a[None], b, sa, sb), ValueError, "a: row-wise scaled_gemm takes 2-D operands"),
    (lambda a, b, sa, sb: (a[:, :100], b, sa, sb), ValueError, "cannot be multiplied"),
])
def test_row_wise_scales_are_refused_naming_the_argument(change, error, text):
    args = change(*_rowwise())
    if error is None:
        check_rowwise_scales(*args)
        return
    with pytest.raises(error, match=_literal(text)):
        check_rowwise_scales(*args)


def test_row_wise_scales_without_a_rowwise_kernel_are_refused_with_what_to_do(tmp_path):
    bundle = Bundle(tmp_path, manifest((TENSOR,)), device_query=lambda ordinal: DeviceInfo(ordinal, (9, 0), 132, "NVIDIA H200", 143156))
    with FakeTensorMode():
        a = torch.empty(256, 512, dtype=E4M3, device="cuda")
        w = torch.empty(384, 512, dtype=E4M3, device="cuda")
        sa, sb = torch.empty(256, 1, device="cuda"), torch.empty(1, 384, device="cuda")
        with pytest.raises(NoKernelError, match=r"scale_a, scale_b: row-wise scales \(\(M, 1\) and \(1, N\)\) need "
                                                r"a kernel with scaling rowwise, and bundle sm90a has none"):
            tilekiln.scaled_gemm(a, w.t(), sa, sb, bundle=bundle)
        # Checked before the kernel search: a bad scale is named first.
        with pytest.raises(ValueError, match="scale_b: expected a float32 tensor"):
            tilekiln.scaled_gemm(a, w.t(), sa, sb.to(BF16), bundle=bundle)
        # The bias of a scaled call is checked against the result's type.
        with pytest.raises(ValueError, match=r"bias: dtype torch.float16 is neither the result's \(torch.bfloat16\) "
                                             r"nor torch.float32"):
            tilekiln.scaled_gemm(a, w.t(), sa, sb, bias=torch.empty(384, dtype=torch.float16, device="cuda"),
                                 bundle=bundle)
        with pytest.raises(ValueError, match=r"bias: expected shape \(384,\)"):
            tilekiln.scaled_gemm(a, w.t(), sa, sb, bias=torch.empty(256, dtype=BF16, device="cuda"), bundle=bundle)


def test_the_scaled_operator_carries_row_wise_scales_and_the_bias_in_one_graph_node(bundle):
    from tests.unit.test_torch_ops import traced

    with FakeTensorMode():
        a8 = torch.empty(64, 32, dtype=E4M3, device="cuda")
        w8 = torch.empty(100, 32, dtype=E4M3, device="cuda")
        sa, sb = torch.empty(64, 1, device="cuda"), torch.empty(1, 100, device="cuda")
        bias = torch.empty(100, dtype=BF16, device="cuda")
        result, ops = traced(lambda: tilekiln.scaled_gemm(a8, w8.t(), sa, sb, bias=bias, bundle=bundle))
        assert ops.count("tilekiln.scaled_gemm.default") == 1, ops
        assert result.dtype == BF16 and result.shape == (64, 100) and result.stride() == (104, 1)
        out = torch.empty(64, 100, dtype=torch.float32, device="cuda")
        _, ops = traced(lambda: tilekiln.scaled_gemm(a8, w8.t(), sa, sb, bias=bias.float(), out=out, bundle=bundle))
        assert "tilekiln.scaled_gemm_out.default" in ops
        short = torch.empty(1, 99, device="cuda")
        with pytest.raises(Exception, match=r"scale_b: expected a float32 tensor \(1, N\) = \(1, 100\)"):
            traced(lambda: tilekiln.scaled_gemm(a8, w8.t(), sa, short, bundle=bundle))
        with pytest.raises(Exception, match=r"bias: dtype torch.float16 is neither the result's"):
            traced(lambda: tilekiln.scaled_gemm(a8, w8.t(), sa, sb, bias=bias.half(), bundle=bundle))


# -- linear's residual ----------------------------------------------------------------------------------


def test_linear_hands_the_kernel_a_residual_at_the_results_strides():
    x, w = torch.empty(2, 8, 64, dtype=BF16), torch.empty(96, 64, dtype=BF16)
    r = torch.empty(2, 8, 96, dtype=BF16)
    target, rows = fusable_residual(x, w, r, None)
    assert target is None and rows.shape == (16, 96) and rows.data_ptr() == r.data_ptr()
    # In place: out is the residual, and the kernel writes the elements it has read.
    target, rows = fusable_residual(x, w, r, r)
    assert target.data_ptr() == rows.data_ptr() == r.data_ptr()
    # N = 100 rows are padded to 104 in the result tilekiln allocates: a contiguous residual's
    # strides differ, so torch adds it; with out of its strides the kernel can.
    w100, r100 = torch.empty(100, 64, dtype=BF16), torch.empty(16, 100, dtype=BF16)
    assert fusable_residual(x.view(16, 64), w100, r100, None) is None
    assert fusable_residual(x.view(16, 64), w100, r100, r100) is not None
    # Not the result's type, shape or layout: torch adds it.
    assert fusable_residual(x, w, r.float(), None) is None
    assert fusable_residual(x, w, r[:, :1], None) is None
    assert fusable_residual(x, w, torch.empty(8, 2, 96, dtype=BF16).transpose(0, 1), None) is None
    assert fusable_residual(x, w, None, None) is None
    # One row: its stride is never read.
    one = torch.empty(1, 64, dtype=BF16)
    assert fusable_residual(one, w, torch.empty(1, 96, dtype=BF16), None) is not None
