"""Block-scaled (mxfp8, nvfp4, mxfp4, fp4-e5m3-b32) GEMM on the GPU: every block-scaled kernel against the
float64 product of its dequantized inputs (fp4 operands packed two per byte, as scaled_gemm takes
them) in its own output type (bf16 or fp16), every block-scaled SwiGLU kernel (one CTA or a CTA
pair) against float64 silu(gate) * up of that product, an unpinned fp16 call and the refusal of an
output type no kernel writes, the errors of wrong scales, and the refusal on a bundle without such
kernels.

    python -m pytest -q tests/gpu/test_blockscaled.py   (TILEKILN_TEST_BUNDLE: the bundle under test)

On a CC 10.x device with artifacts/sm100a (B200), sm103a (B300) or sm107a (Rubin) the kernels
run; on Hopper (artifacts/sm90a) only the refusal does.
"""

from __future__ import annotations

import re

import pytest

pytestmark = pytest.mark.gpu

# (M, N, K): odd M and N (tails in both), one scale-factor atom along K, several, a large one.
SHAPES = ((257, 200, 128), (1, 576, 256), (1000, 1032, 1024), (129, 1536, 7168), (4096, 4096, 4096))


# fp4-e5m3-b32: the Rubin bundle only (e5m3 scales as uint8 codes); elsewhere its case skips.
FORMATS = ("mxfp8", "nvfp4", "mxfp4", "fp4-e5m3-b32")


def _mx_kernels(bundle, name="mxfp8", gated=False):
    """The bundle's dense (gemm family) kernels of format ``name``: the SwiGLU ones where ``gated``,
    else the others; scaled_gemm runs no grouped kernel."""
    from tilekiln.spec import BLOCK_SCALE_FORMATS

    fmt = BLOCK_SCALE_FORMATS[name]
    return [k for k in bundle.kernels if k.config.block_scale == fmt.scale and k.config.dtypes.a == fmt.data
            and k.config.activation.gated == gated and k.config.family == "gemm"]


def _operands(torch, m, n, k, gen, name="mxfp8", spread=8):
    """a (M, K) and w (N, K) in format ``name`` (fp4 packed: (M, K/2), (N, K/2)), of normals whose
    scale blocks differ in magnitude by up to 2^(2 spread) (2^16 by default), so a kernel that read
    another block's scale would be far off; their row-major scales. An fp16 result takes
    ``spread`` 2: products of up to 2^4 keep the largest sums of 7168 far below fp16's 65504."""
    from tilekiln import blockscaled as bs

    block = bs.format_of(name).scale.block

    def data(rows):
        spread_ = 2.0 ** torch.randint(-spread, spread + 1, (rows, k // block), device="cuda", generator=gen)
        return torch.randn(rows, k, device="cuda", generator=gen) * spread_.repeat_interleave(block, 1)

    a, sa = bs.quantize_operand(data(m), name)
    w, sw = bs.quantize_operand(data(n), name)
    return a, sa, w, sw


def _result_type(torch, kernel):
    """The torch dtype of ``kernel``'s C (bf16 or fp16), which a pinned call passes as out_dtype."""
    from tilekiln.spec import DTYPES

    return getattr(torch, DTYPES[kernel.config.dtypes.c.value].torch)


def _spread(torch, dtype) -> int:
    """_operands' spread for a result of ``dtype``: narrower for fp16, whose largest finite value is 65504."""
    return 2 if dtype == torch.float16 else 8


@pytest.mark.parametrize("name", FORMATS)
def test_every_block_scaled_kernel_matches_the_dequantized_float64_product(torch, bundle, name):
    from tilekiln import blockscaled as bs

    kernels = _mx_kernels(bundle, name)
    if not kernels or torch.cuda.get_device_capability()[0] != 10:
        pytest.skip(f"needs a bundle with {name} kernels on a compute capability 10.x device")
    failures = []
    for kernel in kernels:
        dtype = _result_type(torch, kernel)
        for i, (m, n, k) in enumerate(SHAPES):
            gen = torch.Generator(device="cuda").manual_seed(3700 + 10 * kernel.index + i)
            a, sa, w, sw = _operands(torch, m, n, k, gen, name, _spread(torch, dtype))
            ref = bs.reference_mm(a, sa, w, sw, name)
            runs = []
            for _ in range(2):
                out = torch.full((m, n), float("nan"), device="cuda", dtype=dtype)
                bundle.scaled_gemm(a, w.t(), bs.to_blocked(sa), bs.to_blocked(sw), out=out, out_dtype=dtype,
                                   kernel=kernel.id, scale_format=name)
                runs.append(out)
            torch.cuda.synchronize()
            per_row = (runs[0].double() - ref).norm(dim=1) / ref.norm(dim=1)
            err = per_row.max().item() if not torch.isnan(runs[0]).any() else float("nan")
            if not err < 1e-2:
                failures.append(f"{kernel.id} {(m, n, k)}: relative error of the worst row {err:.3g}")
            if not torch.equal(runs[0], runs[1]):
                failures.append(f"{kernel.id} {(m, n, k)}: two runs differ")
    assert not failures, "\n".join(failures)


# (M, N, K) of the SwiGLU runs: N = 2I with I a multiple of 64 (whole gate and up blocks); odd M,
# one scale-factor atom along K, several, a large one.
SWIGLU_SHAPES = ((257, 256, 128), (1, 768, 256), (1000, 1024, 1024), (129, 1536, 7168))


def _swiglu_reference(torch, product):
    """float64 silu(gate) * up of ``product`` (M, N), whose columns interleave gate and up in blocks of
    64 (tilekiln.swiglu_weight): (M, N/2)."""
    m, n = product.shape
    blocks = product.reshape(m, n // 128, 2, 64)
    gate, up = blocks[:, :, 0, :], blocks[:, :, 1, :]
    return (gate * torch.sigmoid(gate) * up).reshape(m, n // 2)


@pytest.mark.parametrize("name", FORMATS)
def test_every_block_scaled_swiglu_kernel_matches_float64_silu_gate_times_up(torch, bundle, name):
    """Each SwiGLU kernel, pinned, against float64 silu(gate) * up of the dequantized product; then an
    unpinned call whose I (160) is not a multiple of 64, which the ungated GEMM and torch compute."""
    import tilekiln
    from tilekiln import blockscaled as bs

    kernels = _mx_kernels(bundle, name, gated=True)
    if not kernels or torch.cuda.get_device_capability()[0] != 10:
        pytest.skip(f"needs a bundle with {name} SwiGLU kernels on a compute capability 10.x device")
    failures = []
    runs = ([(kernel.id, _result_type(torch, kernel), shape) for kernel in kernels for shape in SWIGLU_SHAPES]
            + [(None, torch.bfloat16, (300, 320, 256))])
    for i, (kernel_id, dtype, (m, n, k)) in enumerate(runs):
        gen = torch.Generator(device="cuda").manual_seed(3950 + i)
        a, sa, w, sw = _operands(torch, m, n, k, gen, name, _spread(torch, dtype))
        ref = _swiglu_reference(torch, bs.reference_mm(a, sa, w, sw, name))
        args = (a, w.t(), bs.to_blocked(sa), bs.to_blocked(sw))
        if kernel_id is None:
            out = tilekiln.scaled_gemm(*args, scale_format=name, activation="swiglu", bundle=bundle)
        else:
            out = torch.full((m, n // 2), float("nan"), device="cuda", dtype=dtype)
            bundle.scaled_gemm(*args, out=out, out_dtype=dtype, kernel=kernel_id, scale_format=name,
                               activation="swiglu")
        torch.cuda.synchronize()
        assert out.shape == (m, n // 2) and out.dtype == dtype
        per_row = (out.double() - ref).norm(dim=1) / ref.norm(dim=1).clamp_min(1e-30)
        err = per_row.max().item() if not torch.isnan(out).any() else float("nan")
        if not err < 1e-2:
            failures.append(f"{kernel_id or 'unpinned'} {(m, n, k)}: relative error of the worst row {err:.3g}")
    assert not failures, "\n".join(failures)


@pytest.mark.parametrize("name", FORMATS)
def test_an_fp16_call_runs_an_fp16_kernel_or_is_refused_naming_out_dtype(torch, bundle, name):
    """``out_dtype=torch.float16``, unpinned (tilekiln.scaled_gemm on the bundle), plain and with
    swiglu: where a kernel of the format writes fp16, an fp16 result against the float64 product
    (swiglu: fused where an fp16 SwiGLU kernel pairs the columns, else the fp16 GEMM and torch);
    where none does, NoKernelError naming out_dtype, never a bf16 result."""
    import tilekiln
    from tilekiln import blockscaled as bs
    from tilekiln.errors import NoKernelError

    kernels = _mx_kernels(bundle, name)
    if not kernels or torch.cuda.get_device_capability()[0] != 10:
        pytest.skip(f"needs a bundle with {name} kernels on a compute capability 10.x device")
    gen = torch.Generator(device="cuda").manual_seed(3990)
    m, n, k = 1000, 1024, 1024
    a, sa, w, sw = _operands(torch, m, n, k, gen, name, _spread(torch, torch.float16))
    args = (a, w.t(), bs.to_blocked(sa), bs.to_blocked(sw))
    if not any(kernel.config.dtypes.c.value == "f16" for kernel in kernels):
        with pytest.raises(NoKernelError, match=rf"out_dtype: scale_format='{name}' with a torch\.float16 result"):
            tilekiln.scaled_gemm(*args, scale_format=name, out_dtype=torch.float16, bundle=bundle)
        return
    product = bs.reference_mm(a, sa, w, sw, name)
    failures = []
    for activation, ref in ((None, product), ("swiglu", _swiglu_reference(torch, product))):
        out = tilekiln.scaled_gemm(*args, scale_format=name, out_dtype=torch.float16, activation=activation,
                                   bundle=bundle)
        torch.cuda.synchronize()
        assert out.dtype == torch.float16 and out.shape == ref.shape
        per_row = (out.double() - ref).norm(dim=1) / ref.norm(dim=1).clamp_min(1e-30)
        err = per_row.max().item() if torch.isfinite(out).all() else float("nan")
        if not err < 1e-2:
            failures.append(f"{activation or 'plain'}: relative error of the worst row {err:.3g}")
    assert not failures, "\n".join(failures)


@pytest.mark.parametrize("change, error, text", [
    (lambda t, a, b, sa, sb: (a, b, sa.view(t.uint8), sb), ValueError, "scale_a: dtype torch.uint8"),
    (lambda t, a, b, sa, sb: (a, b, sa, sb[:1]), ValueError, "scale_b: shape [1, 2, 32, 4, 4]"),
    (lambda t, a, b, sa, sb: (a, b, sa.cpu(), sb), ValueError, "scale_a: on cpu, not the inputs' device"),
    (lambda t, a, b, sa, sb: (a[:, :96], b[:96], sa, sb), ValueError, "a: K = 96 is not a multiple of 128"),
])
def test_wrong_scales_raise_naming_the_argument_and_leave_the_device_usable(torch, bundle, change, error, text):
    from tilekiln import blockscaled as bs

    if not _mx_kernels(bundle):
        pytest.skip("the bundle has no mxfp8 kernel")
    gen = torch.Generator(device="cuda").manual_seed(3800)
    a, sa, w, sw = _operands(torch, 300, 200, 256, gen)
    args = (a, w.t(), bs.to_blocked(sa), bs.to_blocked(sw))
    bundle.scaled_gemm(*args, scale_format="mxfp8")
    with pytest.raises(error, match=re.escape(text)):
        bundle.scaled_gemm(*change(torch, *args), scale_format="mxfp8")
    out = bundle.scaled_gemm(*args, scale_format="mxfp8")
    torch.cuda.synchronize()
    assert not torch.isnan(out).any()


@pytest.mark.parametrize("name, change, error, text", [
    ("nvfp4", lambda t, a, b, sa, sb: (a.view(t.uint8), b, sa, sb), TypeError,
     "a: nvfp4 takes torch.float4_e2m1fn_x2 elements packed two per byte, got torch.uint8"),
    ("nvfp4", lambda t, a, b, sa, sb: (a, b, sa.view(t.float8_e8m0fnu), sb), ValueError,
     "scale_a: dtype torch.float8_e8m0fnu, not torch.float8_e4m3fn"),
    ("mxfp4", lambda t, a, b, sa, sb: (a[:, :48], b[:48], sa, sb), ValueError,
     "a: K = 96 (a.shape[1] = 48 bytes of two elements) is not a multiple of 128"),
])
def test_wrong_fp4_operands_raise_naming_the_argument_and_leave_the_device_usable(torch, bundle, name, change, error,
                                                                                   text):
    from tilekiln import blockscaled as bs

    if not _mx_kernels(bundle, name):
        pytest.skip(f"the bundle has no {name} kernel")
    gen = torch.Generator(device="cuda").manual_seed(3850)
    a, sa, w, sw = _operands(torch, 300, 200, 256, gen, name)
    args = (a, w.t(), bs.to_blocked(sa), bs.to_blocked(sw))
    with pytest.raises(error, match=re.escape(text)):
        bundle.scaled_gemm(*change(torch, *args), scale_format=name)
    out = bundle.scaled_gemm(*args, scale_format=name)
    torch.cuda.synchronize()
    assert not torch.isnan(out).any()


def test_a_bundle_without_mxfp8_kernels_refuses_with_the_arch_message(torch, bundle):
    from tilekiln import blockscaled as bs
    from tilekiln.errors import NoKernelError

    if _mx_kernels(bundle):
        pytest.skip("the bundle has mxfp8 kernels")
    gen = torch.Generator(device="cuda").manual_seed(3900)
    a, sa, w, sw = _operands(torch, 128, 128, 128, gen)
    with pytest.raises(NoKernelError, match=r"scale_format='mxfp8': bundle .* has no mxfp8 kernels; the block-scaled "
                                            r"tcgen05 MMA exists on compute capability 10\.x"):
        bundle.scaled_gemm(a, w.t(), bs.to_blocked(sa), bs.to_blocked(sw), scale_format="mxfp8")
