"""Cluster-launch-control kernels (``scheduler: clc``) on the GPU: each against a float64 reference
and against its static twin, on problems of one cluster tile (the first try_cancel is refused),
a ragged one, and ones with many more cluster tiles than the device holds (clusters cancel
clusters), batched; and the runtime's choice of the clc kernel over its twin.

    python -m pytest -q tests/gpu/test_clc_scheduler.py   (TILEKILN_TEST_BUNDLE: the bundle under test)

Cluster launch control exists on compute capability 10.x only: on Hopper (artifacts/sm90a, which
has no clc kernel) every case skips. No clc kernel has run on hardware before this test.
"""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.gpu

# (M, N, K, batch): one tile, ragged edges, 2048 cluster tiles of the 256x256 CTA pairs (far more
# than the 74 pairs of a B200's 148 SMs), and a batch of 3 of 128 each (bf16 only).
SHAPES = ((128, 256, 64, 1), (1000, 1040, 528, 1), (8192, 16384, 512, 1), (2048, 4096, 256, 3))


def _clc_kernels(bundle, torch):
    from tilekiln.spec import Scheduler

    kernels = [k for k in bundle.kernels if k.config.scheduler is Scheduler.CLC]
    if not kernels or torch.cuda.get_device_capability()[0] != 10:
        pytest.skip("needs a bundle with scheduler: clc kernels on a compute capability 10.x device")
    return kernels


def _twin(bundle, kernel):
    (twin,) = [k for k in bundle.kernels if k.id == kernel.id.removesuffix("_clc")]
    return twin


def _run(bundle, torch, kernel_id, a, w, fp8):
    if fp8:
        sa, sb = torch.tensor([0.5], device="cuda"), torch.tensor([0.25], device="cuda")
        return bundle.scaled_gemm(a, w.transpose(-1, -2), sa, sb, kernel=kernel_id)
    return bundle.gemm(a, w.transpose(-1, -2), kernel=kernel_id)


def test_every_clc_kernel_matches_float64_and_its_static_twin_bit_for_bit(torch, bundle):
    failures = []
    for kernel in _clc_kernels(bundle, torch):
        fp8 = kernel.config.dtypes.a.value in ("e4m3", "e5m2")
        twin = _twin(bundle, kernel)
        for i, (m, n, k, batch) in enumerate(SHAPES):
            if fp8 and batch > 1:
                continue  # scaled_gemm takes 2-D operands, as torch._scaled_mm does
            gen = torch.Generator(device="cuda").manual_seed(4100 + 10 * kernel.index + i)
            lead = (batch,) if batch > 1 else ()
            a = torch.randn(*lead, m, k, device="cuda", generator=gen)
            w = torch.randn(*lead, n, k, device="cuda", generator=gen)
            if fp8:
                a, w = a.to(torch.float8_e4m3fn), w.to(torch.float8_e4m3fn)
            else:
                a, w = a.to(torch.bfloat16), w.to(torch.bfloat16)
            ref = torch.matmul(a.double(), w.double().transpose(-1, -2)) * (0.125 if fp8 else 1.0)
            out = _run(bundle, torch, kernel.id, a, w, fp8)
            again = _run(bundle, torch, kernel.id, a, w, fp8)
            static = _run(bundle, torch, twin.id, a, w, fp8)
            torch.cuda.synchronize()
            err = ((out.double() - ref).norm() / ref.norm()).item()
            if torch.isnan(out).any() or not err < 1e-2:
                failures.append(f"{kernel.id} {(m, n, k, batch)}: relative error {err:.3g}")
            # Each tile's MMAs and epilogue are the twin's; only which cluster computes it differs.
            if not (torch.equal(out, again) and torch.equal(out, static)):
                failures.append(f"{kernel.id} {(m, n, k, batch)}: differs from another run or from {twin.id}")
    assert not failures, "\n".join(failures)


def test_the_runtime_runs_the_clc_kernel_where_its_twin_also_fits(torch, bundle):
    for kernel in _clc_kernels(bundle, torch):
        if kernel.config.dtypes.a.value != "bf16":
            continue
        a = torch.randn(4096, 4096, device="cuda", dtype=torch.bfloat16)
        w = torch.randn(4096, 4096, device="cuda", dtype=torch.bfloat16)
        choice = bundle.explain(a, w.t())
        twin = _twin(bundle, kernel).id
        labels = [line.split()[1].rstrip(":") for line in str(choice).splitlines()[1:]]
        # Where the model picks either of the pair, it picks the clc one, listed before its twin.
        if choice.kernel.id in (kernel.id, twin) and choice.how == "model":
            assert choice.kernel.id == kernel.id
            assert labels.index(kernel.id) < labels.index(twin)
