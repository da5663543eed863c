"""Every kernel of the default bundle against a float64 reference on the GPU."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.gpu

SHAPES = [  # (batch, M, N, K); tails in every dimension, K not a multiple of the tile
    (1, 512, 512, 256),
    (1, 1000, 1032, 520),
    (1, 1000, 1040, 528),
    (3, 264, 136, 72),
    (1, 8, 8, 8),
    (2, 129, 264, 1000),
    (1, 4096, 4096, 4096),
]


def _torch():
    import torch

    return torch


FP8 = {"e4m3": "float8_e4m3fn", "e5m2": "float8_e5m2"}


def make_operands(kernel, batch, m, n, k, seed):
    torch = _torch()
    g = torch.Generator(device="cuda").manual_seed(seed)
    if kernel.dtypes[0] in FP8:  # fp8 kernels are K-major only (wgmma reads 8-bit operands K-major)
        a = torch.randn(batch, m, k, device="cuda", generator=g).to(getattr(torch, FP8[kernel.dtypes[0]]))
        b = torch.randn(batch, n, k, device="cuda", generator=g).to(getattr(torch, FP8[kernel.dtypes[1]]))
        return a, b.transpose(1, 2)
    dtype = {"bf16": torch.bfloat16, "f16": torch.float16}[kernel.dtypes[0]]

    def matrix(rows, cols, contiguous_rows):
        """(batch, rows, cols); MN-major operands get a 16-byte-padded leading dimension."""
        if contiguous_rows:
            return torch.randn(batch, rows, cols, device="cuda", dtype=dtype, generator=g)
        lead = (rows + 7) // 8 * 8
        return torch.randn(batch, cols, lead, device="cuda", dtype=dtype, generator=g)[..., :rows].transpose(1, 2)

    a = matrix(m, k, kernel.a_major == "k")
    b = matrix(k, n, kernel.b_major == "n")
    return a, b


def relative_error(out, a, b):
    torch = _torch()
    ref = torch.matmul(a.double(), b.double())
    return ((out.double() - ref).norm() / ref.norm()).item()


@pytest.fixture(scope="module")
def bundle(gpu_bundle_dir):
    import tilekiln

    return tilekiln.load(gpu_bundle_dir)


def test_every_kernel_matches_float64_reference(bundle):
    torch = _torch()
    failures = []
    for kernel in bundle.kernels:
        if kernel.dtypes[3] == "f32":
            continue  # fp32-partial kernels: test_split_k_and_fp32_results
        for i, (batch, m, n, k) in enumerate(SHAPES):
            a, b = make_operands(kernel, batch, m, n, k, seed=1000 * kernel.index + i)
            if kernel.dtypes[0] in FP8:
                if batch != 1 or k % 16:
                    continue  # fp8 rows must be 16-byte multiples; scaled GEMMs are 2-D here
                a, b = a[0], b[0]
                sa = torch.tensor([0.5], device="cuda")
                sb = torch.tensor([0.25], device="cuda")
                out = torch.full((m, n), float("nan"), device="cuda", dtype=torch.bfloat16)
                bundle.scaled_gemm(a, b, sa, sb, out=out, kernel=kernel.id)
                torch.cuda.synchronize()
                ref = (a.double() @ b.double()) * 0.125
                err = ((out.double() - ref).norm() / ref.norm()).item()
            else:
                out = torch.full((batch, m, n), float("nan"), device="cuda", dtype=a.dtype)
                bundle.gemm(a, b, out, kernel=kernel.id)
                torch.cuda.synchronize()
                err = relative_error(out, a, b)
            if torch.isnan(out).any() or not err < 1e-2:
                failures.append(f"{kernel.id} {(batch, m, n, k)}: relative error {err:.3g}")
    assert not failures, "\n".join(failures)


SPLIT_SHAPES = [(1000, 1032, 4096, 2), (16, 8192, 8192, 4), (64, 520, 8192, 8), (256, 4096, 14336, 2)]


def test_split_k_and_fp32_results(bundle):
    """Every fp32-partial kernel as split-K (bf16 out) against float64, bitwise repeatable;
    the fp8 ones also straight to a float32 result (torch._scaled_mm's out_dtype)."""
    torch = _torch()
    failures = []
    for kernel in (k for k in bundle.kernels if k.dtypes[3] == "f32"):
        fp8 = kernel.dtypes[0] in FP8
        for i, (m, n, k, split) in enumerate(SPLIT_SHAPES):
            g = torch.Generator(device="cuda").manual_seed(7000 + 10 * kernel.index + i)
            a = torch.randn(m, k, device="cuda", generator=g)
            w = torch.randn(n, k, device="cuda", generator=g)
            pin = f"{kernel.id}/splitk{split}"
            if fp8:
                a, w = a.to(torch.float8_e4m3fn), w.to(torch.float8_e4m3fn)
                sa, sb = torch.tensor([0.5], device="cuda"), torch.tensor([0.25], device="cuda")
                ref = (a.double() @ w.double().t()) * 0.125
                runs = [bundle.scaled_gemm(a, w.t(), sa, sb, kernel=pin) for _ in range(2)]
                runs.append(bundle.scaled_gemm(a, w.t(), sa, sb, out_dtype=torch.float32, kernel=kernel.id))
            else:
                a, w = a.to(torch.bfloat16), w.to(torch.bfloat16)
                ref = a.double() @ w.double().t()
                runs = [bundle.gemm(a, w.t(), kernel=pin) for _ in range(2)]
            torch.cuda.synchronize()
            for out in runs:
                err = ((out.double() - ref).norm() / ref.norm()).item()
                if torch.isnan(out).any() or not err < 1e-2:
                    failures.append(f"{pin} {(m, n, k)} -> {out.dtype}: relative error {err:.3g}")
            if not torch.equal(runs[0], runs[1]):
                failures.append(f"{pin} {(m, n, k)}: two runs differ")
    assert not failures, "\n".join(failures)


def test_selected_kernels_for_torch_views(bundle):
    """Plain torch calls: transposed views, padded leading dims, batched and broadcast batch."""
    torch = _torch()
    bf = torch.bfloat16
    cases = {
        "2d": (torch.randn(300, 520, device="cuda", dtype=bf), torch.randn(520, 264, device="cuda", dtype=bf)),
        "a_t": (torch.randn(520, 304, device="cuda", dtype=bf).t(), torch.randn(520, 264, device="cuda", dtype=bf)),
        "b_t": (torch.randn(300, 520, device="cuda", dtype=bf), torch.randn(264, 520, device="cuda", dtype=bf).t()),
        "both_t": (torch.randn(520, 304, device="cuda", dtype=bf).t(), torch.randn(264, 520, device="cuda", dtype=bf).t()),
        "padded": (torch.randn(300, 528, device="cuda", dtype=bf)[:, :520], torch.randn(520, 272, device="cuda", dtype=bf)[:, :264]),
        "batched": (torch.randn(4, 200, 136, device="cuda", dtype=bf), torch.randn(4, 136, 72, device="cuda", dtype=bf)),
        "broadcast_b": (torch.randn(4, 200, 136, device="cuda", dtype=bf), torch.randn(136, 72, device="cuda", dtype=bf)),
        "broadcast_a": (torch.randn(200, 136, device="cuda", dtype=bf), torch.randn(4, 136, 72, device="cuda", dtype=bf)),
        "fp16": (torch.randn(257, 520, device="cuda", dtype=torch.float16), torch.randn(520, 264, device="cuda", dtype=torch.float16)),
    }
    for name, (a, b) in cases.items():
        out = bundle.gemm(a, b)
        torch.cuda.synchronize()
        assert out.shape == torch.matmul(a, b).shape, name
        assert relative_error(out, a, b) < 1e-2, name


def test_zero_sized_problems_follow_torch(bundle):
    torch = _torch()
    a = torch.randn(16, 0, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(0, 24, device="cuda", dtype=torch.bfloat16)
    out = bundle.gemm(a, b)
    assert out.shape == (16, 24) and bool((out == 0).all())
    empty = bundle.gemm(torch.randn(0, 8, device="cuda", dtype=torch.bfloat16),
                        torch.randn(8, 8, device="cuda", dtype=torch.bfloat16))
    assert empty.shape == (0, 8)


def test_invalid_inputs_raise_and_leave_the_device_usable(bundle):
    torch = _torch()
    bf = torch.bfloat16
    a = torch.randn(64, 64, device="cuda", dtype=bf)
    with pytest.raises(ValueError, match="stride"):
        bundle.gemm(torch.randn(64, 63, device="cuda", dtype=bf), torch.randn(63, 64, device="cuda", dtype=bf))
    with pytest.raises(ValueError, match="16-byte aligned"):
        flat = torch.randn(64 * 64 + 1, device="cuda", dtype=bf)
        bundle.gemm(flat[1:].view(64, 64), a)
    with pytest.raises(TypeError, match="dtype"):
        bundle.gemm(a, a.half())
    with pytest.raises(ValueError, match="cannot be multiplied"):
        bundle.gemm(a, torch.randn(32, 64, device="cuda", dtype=bf))
    with pytest.raises(ValueError, match="host memory"):
        bundle.gemm(a.cpu(), a.cpu())
    out = bundle.gemm(a, a)
    torch.cuda.synchronize()
    assert relative_error(out, a, a) < 1e-2
