"""Block-scaled (mxfp8) GEMM on the GPU: every mxfp8 kernel against the float64 product of its
dequantized inputs, the errors of wrong scales, and the refusal on a bundle without such kernels.

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


def _mx_kernels(bundle):
    return [k for k in bundle.kernels if k.config.block_scale is not None and k.config.dtypes.a.value == "e4m3"]


def _operands(torch, m, n, k, gen):
    """mxfp8 a (M, K) and w (N, K) of normals whose 32-element blocks differ in magnitude by up to
    2^16, so a kernel that read another block's scale would be far off; the blocked scales."""
    from tilekiln import blockscaled as bs

    def data(rows):
        spread = 2.0 ** torch.randint(-8, 9, (rows, k // 32), device="cuda", generator=gen)
        return torch.randn(rows, k, device="cuda", generator=gen) * spread.repeat_interleave(32, 1)

    a, sa = bs.quantize(data(m), "mxfp8")
    w, sw = bs.quantize(data(n), "mxfp8")
    return a, sa, w, sw


def test_every_mxfp8_kernel_matches_the_dequantized_float64_product(torch, bundle):
    from tilekiln import blockscaled as bs

    kernels = _mx_kernels(bundle)
    if not kernels or torch.cuda.get_device_capability()[0] != 10:
        pytest.skip("needs a bundle with mxfp8 kernels on a compute capability 10.x device")
    failures = []
    for kernel in kernels:
        for i, (m, n, k) in enumerate(SHAPES):
            gen = torch.Generator(device="cuda").manual_seed(3700 + 10 * kernel.index + i)
            a, sa, w, sw = _operands(torch, m, n, k, gen)
            ref = bs.reference_mm(a, sa, w, sw, "mxfp8")
            runs = []
            for _ in range(2):
                out = torch.full((m, n), float("nan"), device="cuda", dtype=torch.bfloat16)
                bundle.scaled_gemm(a, w.t(), bs.to_blocked(sa), bs.to_blocked(sw), out=out, kernel=kernel.id,
                                   scale_format="mxfp8")
                runs.append(out)
            torch.cuda.synchronize()
            per_row = (runs[0].double() - ref).norm(dim=1) / ref.norm(dim=1)
            err = per_row.max().item() if not torch.isnan(runs[0]).any() else float("nan")
            if not err < 1e-2:
                failures.append(f"{kernel.id} {(m, n, k)}: relative error of the worst row {err:.3g}")
            if not torch.equal(runs[0], runs[1]):
                failures.append(f"{kernel.id} {(m, n, k)}: two runs differ")
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
