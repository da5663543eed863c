"""Every kernel of the default bundle against a float64 reference on the GPU."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.gpu


def _torch():
    import torch

    return torch


FP8 = {"e4m3": "float8_e4m3fn", "e5m2": "float8_e5m2"}


def relative_error(out, a, b):
    torch = _torch()
    ref = torch.matmul(a.double(), b.double())
    return ((out.double() - ref).norm() / ref.norm()).item()


@pytest.fixture(scope="module")
def bundle(gpu_bundle_dir):
    import tilekiln

    return tilekiln.load(gpu_bundle_dir)


def test_every_kernel_matches_float64_reference(bundle):
    """tilekiln.verify's runs of every kernel (what `tilekiln verify` records) all pass."""
    from tilekiln.verify import verify

    torch = _torch()
    record, results = verify(bundle, torch, seed=20261206)
    failures = [f for r in results for f in r.failures]
    assert not failures, "\n".join(failures)
    assert sorted(record["kernels"]) == sorted(k.id for k in bundle.kernels) and not record["failed"]
    print(f"{len(results)} kernels on {record['sku']}, worst relative error "
          f"{max(r.max_rel_error for r in results):.3g}")


SPLIT_SHAPES = [(1000, 1032, 4096, 2), (16, 8192, 8192, 4), (64, 520, 8192, 8), (256, 4096, 14336, 2)]


def test_split_k_and_fp32_results(bundle):
    """Every fp32-partial kernel as split-K (bf16 out) against float64, bitwise repeatable;
    the fp8 ones also straight to a float32 result (torch._scaled_mm's out_dtype)."""
    torch = _torch()
    failures = []
    # Per-tensor scaling only: tests/gpu/test_blockwise.py runs the blockwise fp32-partial kernels.
    for kernel in (k for k in bundle.kernels if k.config.dtypes.c.value == "f32" and k.config.scaling.value == "tensor"):
        fp8 = kernel.config.dtypes.a.value in FP8
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
