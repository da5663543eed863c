"""A CC 10.0 device selects the tcgen05 dense kernels that fuse the requested epilogue (bias,
row-wise fp8 scales, SwiGLU), as the Hopper ones do, and leaves to torch what no kernel there
computes. No GPU: the bundle's device is a stand-in (tests/unit/test_grouped_cpu.py)."""

from __future__ import annotations

from dataclasses import replace

import pytest

torch = pytest.importorskip("torch")
from torch._subclasses.fake_tensor import FakeTensorMode  # noqa: E402

import tilekiln  # noqa: E402
from tilekiln.spec import format_kernel_id  # noqa: E402
from tests.records import kernel_record  # noqa: E402
from tests.unit.test_grouped_cpu import _blackwell_bundle  # noqa: E402

BF16, E4M3 = torch.bfloat16, torch.float8_e4m3fn
FP8 = ("e4m3", "e4m3", "f32", "bf16")


def tcgen05(record):
    """``record`` as the tcgen05 dense template's kernel: pipeline sm100, 192 threads."""
    config = replace(record.config, pipeline="sm100")
    return replace(record, config=config, id=format_kernel_id(config), threads=192,
                   template=replace(record.template, name="sm100_gemm"))


PLAIN = tcgen05(kernel_record(0, "", (128, 256, 64)))
BIAS = tcgen05(kernel_record(1, "", (128, 256, 64), bias="bf16"))
BIAS_F32_SILU = tcgen05(kernel_record(2, "", (128, 256, 64), bias="f32", activation="silu"))
TENSOR = tcgen05(kernel_record(3, "", (128, 256, 128), dtypes=FP8))
ROWWISE = tcgen05(kernel_record(4, "", (128, 256, 128), dtypes=FP8, scaling="rowwise"))
ROWWISE_BIAS = tcgen05(kernel_record(5, "", (128, 256, 128), dtypes=FP8, scaling="rowwise", bias="bf16"))
KERNELS = (PLAIN, BIAS, BIAS_F32_SILU, TENSOR, ROWWISE, ROWWISE_BIAS)


def test_a_cc_10_device_runs_the_fused_bias_and_row_wise_kernels(tmp_path):
    bundle = _blackwell_bundle(tmp_path, KERNELS)
    assert BIAS.id == "gemm_sm100_bf16_bf16_f32_bf16_tn_128x256x64_c1x1_biasbf16"
    assert ROWWISE_BIAS.id == "gemm_sm100_e4m3_e4m3_f32_bf16_tn_128x256x128_c1x1_rowwise_biasbf16"
    with FakeTensorMode():
        x, w = torch.empty(4096, 2048, dtype=BF16, device="cuda"), torch.empty(1536, 2048, dtype=BF16, device="cuda")
        assert tilekiln.explain(x, w.t(), bundle=bundle).kernel.id == PLAIN.id
        choice = tilekiln.explain(x, w.t(), bundle=bundle, bias=BF16)
        assert choice.kernel.id == BIAS.id and not choice.notes
        choice = tilekiln.explain(x, w.t(), bundle=bundle, bias=torch.float32, activation="silu")
        assert choice.kernel.id == BIAS_F32_SILU.id and not choice.notes
        # No bf16 bias with silu here: the bias kernel runs and torch applies silu after it.
        choice = tilekiln.explain(x, w.t(), bundle=bundle, bias=BF16, activation="silu")
        assert choice.kernel.id == BIAS.id and "activation silu" in choice.notes[0]
        a8, w8 = torch.empty(4096, 2048, dtype=E4M3, device="cuda"), torch.empty(1536, 2048, dtype=E4M3, device="cuda")
        assert tilekiln.explain(a8, w8.t(), bundle=bundle, scale_format="rowwise").kernel.id == ROWWISE.id
        choice = tilekiln.explain(a8, w8.t(), bundle=bundle, scale_format="rowwise", bias=BF16)
        assert choice.kernel.id == ROWWISE_BIAS.id and not choice.notes
        assert tilekiln.explain(a8, w8.t(), bundle=bundle, out_dtype=BF16).kernel.id == TENSOR.id


def test_row_wise_scales_never_run_on_a_per_tensor_tcgen05_kernel(tmp_path):
    bundle = _blackwell_bundle(tmp_path, (PLAIN, TENSOR))
    with FakeTensorMode():
        a8, w8 = torch.empty(4096, 2048, dtype=E4M3, device="cuda"), torch.empty(1536, 2048, dtype=E4M3, device="cuda")
        assert tilekiln.explain(a8, w8.t(), bundle=bundle, scale_format="rowwise").kernel is None


def test_a_cc_10_device_runs_swiglu_on_the_gated_tcgen05_kernel(tmp_path):
    """swiglu(x, w_gate_up): B's 2I rows interleave gate and up blocks; the gated kernel computes it,
    and without one the ungated GEMM runs and torch pairs the columns."""
    gated = tcgen05(kernel_record(6, "", (128, 256, 64), activation="swiglu"))
    assert gated.id == "gemm_sm100_bf16_bf16_f32_bf16_tn_128x256x64_c1x1_swiglu"
    with FakeTensorMode():
        x, w = torch.empty(4096, 2048, dtype=BF16, device="cuda"), torch.empty(3072, 2048, dtype=BF16, device="cuda")
        choice = tilekiln.explain(x, w.t(), bundle=_blackwell_bundle(tmp_path, (PLAIN, gated)), activation="swiglu")
        assert choice.kernel.id == gated.id and not choice.notes
        choice = tilekiln.explain(x, w.t(), bundle=_blackwell_bundle(tmp_path, (PLAIN,)), activation="swiglu")
        assert choice.kernel.id == PLAIN.id and "activation swiglu" in choice.notes[0]
