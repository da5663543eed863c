"""fp8 e4m3 results with a per-tensor output scale without a GPU: the spec's scale_result argument,
the glue, selection and explain, the runtime's checks of every call (errors name the argument), the
torch operators' fakes, and the saturating reference."""

from __future__ import annotations

import re
from dataclasses import replace
from pathlib import Path

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

import tilekiln
from builder.compile.objfile import EntryPoints
from builder.package.link import LinkInput, render_glue
from tilekiln._tensors import Operand
from tilekiln._torch.epilogue import SCALED_RESULTS, saturate_result
from tilekiln._torch.scales import check_scale_result
from tilekiln.bundle import Bundle, DeviceInfo
from tilekiln.problem import make_problem, requested_epilogue
from tilekiln.select import check_kernel, choose_fused, choose
from tilekiln.spec import FAMILIES, SCALED_OUTPUTS, DType, DTypes, ScalarArg
from tests.records import kernel_record, manifest, pick

E4M3, BF16 = torch.float8_e4m3fn, torch.bfloat16
TO_BF16 = kernel_record(0, "k0", (128, 256, 128), dtypes=("e4m3", "e4m3", "f32", "bf16"))
TO_E4M3 = kernel_record(1, "k1_e4m3", (128, 256, 128), dtypes=("e4m3", "e4m3", "f32", "e4m3"), div=16)
ROWWISE_E4M3 = kernel_record(2, "k2_e4m3_rowwise", (128, 256, 128), dtypes=("e4m3", "e4m3", "f32", "e4m3"),
                             div=16, scaling="rowwise")
KERNELS = (TO_BF16, TO_E4M3, ROWWISE_E4M3)


def _literal(text: str) -> str:
    return re.escape(text)


def _op(name, shape, strides, dtype):
    return Operand(name, shape, strides, dtype, 0x1000, 0, None)


def fp8_problem(m, n, k, out="e4m3", **asked):
    problem = make_problem(_op("a", (m, k), (k, 1), "e4m3"), _op("b", (k, n), (1, k), "e4m3"), None, out)
    return replace(problem, requested=requested_epilogue(**asked))


# -- the spec and the glue --------------------------------------------------------------------------


def test_an_e4m3_result_is_a_scaled_output_saturating_at_torchs_largest_e4m3():
    assert SCALED_OUTPUTS == {"e4m3": torch.finfo(E4M3).max} == {"e4m3": 448.0}
    assert SCALED_RESULTS == {E4M3: "e4m3"}
    fp8 = DTypes(DType("e4m3"), DType("e4m3"), DType("f32"), DType("e4m3"))
    assert fp8.scaled and fp8.scaled_output
    assert not replace(fp8, c=DType("bf16")).scaled_output


def test_the_gemm_family_takes_scale_result_last_and_only_it():
    assert FAMILIES["gemm"].scalars == (ScalarArg("scale_result"),)
    assert all(f.scalars == () for name, f in FAMILIES.items() if name != "gemm")


def test_glue_passes_scale_result_from_the_call_block_as_a_one_element_tensor():
    entry = EntryPoints("p", "p_init", "p_load", "p_launch")
    text = render_glue("sm90a", [LinkInput("gemm_t", "gemm", b"", entry)])
    call = text.split("} tk_call_gemm_t;")[0].rsplit("typedef struct {", 1)[1]
    assert call.index("*residual;") < call.index("*scale_result;") < call.index("*stream;")
    run = text.split("TK_EXPORT int tk_run_gemm(", 1)[1].split("\n}\n", 1)[0]
    assert "struct { void *data; } scale_result = {call->scale_result};" in run
    launch = " ".join(run.split("void *args[13] = {", 1)[1].split("};")[0].split())
    assert launch.endswith("&residual, &scale_result, &alpha, &beta, &clusters, &stream, &result")


# -- selection and explain ------------------------------------------------------------------------------


def test_an_e4m3_result_runs_only_on_an_e4m3_output_kernel_of_the_calls_scaling():
    assert check_kernel(TO_BF16, fp8_problem(1024, 1024, 1024)) is not None
    assert check_kernel(TO_E4M3, fp8_problem(1024, 1024, 1024, out="bf16")) is not None

    def chosen(problem):
        choice, unfused = choose_fused(lambda p: choose(KERNELS, p, 132, pick()), problem)
        return (choice.kernel.id if choice.kernel else None), unfused

    assert chosen(fp8_problem(4096, 4096, 4096)) == ("k1_e4m3", ())
    assert chosen(fp8_problem(4096, 4096, 4096, scaling="rowwise")) == ("k2_e4m3_rowwise", ())
    assert chosen(fp8_problem(4096, 4096, 4096, out="bf16")) == ("k0", ())


@pytest.fixture
def bundle(tmp_path: Path) -> Bundle:
    return Bundle(tmp_path, manifest(KERNELS), device_query=lambda ordinal: DeviceInfo(ordinal, (9, 0), 132, "NVIDIA H200", 143156))


def test_explain_takes_the_result_type(bundle):
    with FakeTensorMode():
        a8 = torch.empty(4096, 4096, dtype=E4M3, device="cuda")
        w8 = torch.empty(4096, 4096, dtype=E4M3, device="cuda")
        assert tilekiln.explain(a8, w8.t(), bundle=bundle, out_dtype=E4M3).kernel.id == "k1_e4m3"
        assert tilekiln.explain(a8, w8.t(), bundle=bundle, out_dtype=E4M3,
                                scale_format="rowwise").kernel.id == "k2_e4m3_rowwise"
        assert tilekiln.explain(a8, w8.t(), bundle=bundle, scale_format="tensor").kernel.id == "k0"
        out = torch.empty(4096, 4096, dtype=E4M3, device="cuda")
        assert tilekiln.explain(a8, w8.t(), bundle=bundle, out=out, scale_format="tensor").kernel.id == "k1_e4m3"


# -- the runtime's checks ---------------------------------------------------------------------------


@pytest.mark.parametrize("scale_result, dtype, error, text", [
    (torch.ones(1), E4M3, None, ""),
    (torch.ones(1, 1), E4M3, None, ""),
    (None, BF16, None, ""),
    (None, E4M3, ValueError, "scale_result: a torch.float8_e4m3fn result is written as saturate(value * "
     "scale_result); pass a one-element float32 tensor on the inputs' device (torch.ones(1, device=a.device) "
     "for none)"),
    (torch.ones(1), BF16, ValueError, "scale_result: applies to a float8_e4m3fn result only, and this call's "
     "result is torch.bfloat16; pass out_dtype=torch.float8_e4m3fn, or drop scale_result"),
    (2.0, E4M3, TypeError, "scale_result: expected a one-element float32 tensor on the inputs' device (the fp8 "
     "result's scale, as torch._scaled_mm takes it); got float"),
    (torch.ones(1, dtype=BF16), E4M3, ValueError, "got dtype torch.bfloat16 (convert with .float())"),
    (torch.ones(2), E4M3, ValueError, "got 2 elements"),
    (torch.ones(1, device="meta"), E4M3, ValueError, "got device meta"),
])
def test_scale_result_is_checked_against_the_result_type(scale_result, dtype, error, text):
    if error is None:
        check_scale_result(scale_result, dtype, torch.device("cpu"))
        return
    with pytest.raises(error, match=_literal(text)):
        check_scale_result(scale_result, dtype, torch.device("cpu"))


def test_an_fp8_call_is_refused_before_any_kernel_search_naming_the_argument(bundle):
    with FakeTensorMode():
        a = torch.empty(256, 512, dtype=E4M3, device="cuda")
        w = torch.empty(384, 512, dtype=E4M3, device="cuda")
        one = torch.ones(1, device="cuda")
        with pytest.raises(ValueError, match=_literal("scale_result: a torch.float8_e4m3fn result is written")):
            tilekiln.scaled_gemm(a, w.t(), one, one, out_dtype=E4M3, bundle=bundle)
        with pytest.raises(ValueError, match=_literal("scale_result: applies to a float8_e4m3fn result only")):
            tilekiln.scaled_gemm(a, w.t(), one, one, scale_result=one, bundle=bundle)
        with pytest.raises(ValueError, match=_literal("bias: a torch.float8_e4m3fn result takes no bias")):
            tilekiln.scaled_gemm(a, w.t(), one, one, out_dtype=E4M3, scale_result=one,
                                 bias=torch.empty(384, dtype=BF16, device="cuda"), bundle=bundle)
        with pytest.raises(ValueError, match=_literal("out_dtype: a torch.float8_e4m3fn result is written by "
                                                      "per-tensor or row-wise scaled kernels; "
                                                      "scale_format='blockwise'")):
            tilekiln.scaled_gemm(a, w.t(), one, one, out_dtype=E4M3, scale_result=one, scale_format="blockwise",
                                 bundle=bundle)
        # Bundle.scaled_gemm takes scale_result as tilekiln.scaled_gemm does.
        with pytest.raises(ValueError, match=_literal("scale_result: a torch.float8_e4m3fn result is written")):
            bundle.scaled_gemm(a, w.t(), one, one, out_dtype=E4M3)
        with pytest.raises(ValueError, match=_literal("scale_result: applies to a float8_e4m3fn result only")):
            bundle.scaled_gemm(a, w.t(), one, one, scale_result=one)
        # out= decides the result type as out_dtype does.
        out = torch.empty(256, 384, dtype=E4M3, device="cuda")
        with pytest.raises(ValueError, match=_literal("scale_result: a torch.float8_e4m3fn result is written")):
            tilekiln.scaled_gemm(a, w.t(), one, one, out=out, bundle=bundle)


def test_the_scaled_operator_carries_scale_result_in_one_graph_node(bundle):
    from tests.unit.test_torch_ops import traced

    with FakeTensorMode():
        a8 = torch.empty(64, 32, dtype=E4M3, device="cuda")
        w8 = torch.empty(112, 32, dtype=E4M3, device="cuda")
        one = torch.ones(1, device="cuda")
        result, ops = traced(lambda: tilekiln.scaled_gemm(a8, w8.t(), one, one, out_dtype=E4M3, scale_result=one,
                                                          bundle=bundle))
        assert ops.count("tilekiln.scaled_gemm.default") == 1, ops
        assert result.dtype == E4M3 and result.shape == (64, 112) and result.stride() == (112, 1)
        out = torch.empty(64, 112, dtype=E4M3, device="cuda")
        _, ops = traced(lambda: tilekiln.scaled_gemm(a8, w8.t(), one, one, out=out, scale_result=one, bundle=bundle))
        assert "tilekiln.scaled_gemm_out.default" in ops
        with pytest.raises(Exception, match=_literal("scale_result: a torch.float8_e4m3fn result is written")):
            traced(lambda: tilekiln.scaled_gemm(a8, w8.t(), one, one, out_dtype=E4M3, bundle=bundle))
        with pytest.raises(Exception, match=_literal("scale_result: expected a one-element float32 tensor")):
            traced(lambda: tilekiln.scaled_gemm(a8, w8.t(), one, one, out_dtype=E4M3, scale_result=one.half(),
                                                bundle=bundle))


# -- the reference ------------------------------------------------------------------------------------


def test_the_reference_saturates_to_448_and_rounds_to_e4m3():
    value = torch.tensor([1.0, -3.0, 100.0, -1000.0, 0.3], dtype=torch.float64)
    got = saturate_result(value, 5.0, E4M3)
    assert got.dtype == E4M3
    assert got.double().tolist() == [5.0, -15.0, 448.0, -448.0, 1.5]
    assert not torch.isnan(got.double()).any()
