"""Cluster-launch-control kernels (``scheduler: clc``) on the GPU: each dense one against a float64
reference and against its static twin, on problems of one cluster tile (the first try_cancel is
refused), a ragged one, and ones with many more cluster tiles than the device holds (clusters cancel
clusters), batched; each block-scaled one (dense and grouped) bit for bit against its static twin,
whose float64 checks are tests/gpu/test_blockscaled.py's and test_blockscaled_grouped.py's (which
run the clc kernels too); each grouped one against its twin and, captured in a CUDA graph, replayed
with new offsets or row counts (the grid stays the host's bound, the items change); and the
runtime's choice of the clc kernel over its twin.

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


def _clc_kernels(bundle, torch, family="gemm", block_scaled=False):
    """The bundle's clc kernels of ``family``, block-scaled or not."""
    from tilekiln.spec import Scheduler

    kernels = [k for k in bundle.kernels if k.config.scheduler is Scheduler.CLC and k.config.family == family
               and (k.config.block_scale is not None) == block_scaled]
    if not kernels or torch.cuda.get_device_capability()[0] != 10:
        pytest.skip(f"needs a bundle with scheduler: clc {family} kernels on a compute capability 10.x device")
    return kernels


def _format(kernel):
    """The scale_format name of a block-scaled kernel."""
    from tilekiln.spec import BLOCK_SCALE_FORMATS

    (name,) = [n for n, f in BLOCK_SCALE_FORMATS.items()
               if f.scale == kernel.config.block_scale and f.data == kernel.config.dtypes.a]
    return name


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


def test_every_block_scaled_clc_kernel_equals_its_static_twin(torch, bundle):
    from tilekiln import blockscaled as bs

    failures = []
    for kernel in _clc_kernels(bundle, torch, block_scaled=True):
        name, twin = _format(kernel), _twin(bundle, kernel)
        for i, (m, n, k) in enumerate(((128, 256, 768), (1000, 1040, 1536), (8192, 8192, 768))):
            gen = torch.Generator(device="cuda").manual_seed(4300 + 10 * kernel.index + i)
            a, sa = bs.quantize_operand(torch.randn(m, k, device="cuda", generator=gen), name)
            w, sw = bs.quantize_operand(torch.randn(n, k, device="cuda", generator=gen), name)
            args = (a, w.t(), bs.to_blocked(sa), bs.to_blocked(sw))
            out = bundle.scaled_gemm(*args, kernel=kernel.id, scale_format=name)
            static = bundle.scaled_gemm(*args, kernel=twin.id, scale_format=name)
            torch.cuda.synchronize()
            if out.isnan().any() or not torch.equal(out, static):
                failures.append(f"{kernel.id} {(m, n, k)}: differs from {twin.id} (or NaN)")
    assert not failures, "\n".join(failures)


# Rows per group: empty groups, partial tiles, one group with every row, and many more tiles than
# the device holds clusters; each sums to TOTAL_M, so one capture serves them all.
TOTAL_M = 8192
ROUTINGS = ([TOTAL_M // 16] * 16, [TOTAL_M] + [0] * 15, [0] * 15 + [TOTAL_M],
            [0, 3, 0, 200, 1, 0, 900, 0, 64, 65, 0, 127, 129, 0, 7, TOTAL_M - 1496])


def _grouped_operands(torch, kernel, groups, m, n, k, gen):
    """A (total_M or (G, M_max)) x K, B (G, N, K) passed transposed, and the scale arguments."""
    from tilekiln import blockscaled as bs

    masked = kernel.config.family == "grouped_masked"
    shape = (groups, m, k) if masked else (m, k)
    if kernel.config.block_scale is None:
        a = torch.randn(*shape, device="cuda", generator=gen).to(torch.bfloat16)
        w = (torch.randn(groups, n, k, device="cuda", generator=gen) / k**0.5).to(torch.bfloat16)
        return a, w.transpose(1, 2), None, None
    name = _format(kernel)
    a, sa = bs.quantize_operand(torch.randn(*shape, device="cuda", generator=gen), name)
    w, sw = bs.quantize_operand(torch.randn(groups, n, k, device="cuda", generator=gen), name)
    return a, w.transpose(1, 2), sa, bs.to_blocked(sw)


def _grouped_call(bundle, kernel_id, a, b, rows, out, sa, sb, name):
    from tilekiln import blockscaled as bs

    if a.dim() == 3:
        scales = {} if sa is None else {"scale_a": bs.to_blocked(sa), "scale_b": sb, "scale_format": name}
        return bundle.grouped_gemm_masked(a, b, rows, out=out, kernel=kernel_id, **scales)
    scales = {} if sa is None else {"scale_a": bs.to_blocked_grouped(sa, rows), "scale_b": sb, "scale_format": name}
    return bundle.grouped_gemm(a, b, rows, out=out, kernel=kernel_id, **scales)


@pytest.mark.parametrize("family", ["grouped", "grouped_masked"])
@pytest.mark.parametrize("block_scaled", [False, True])
def test_every_grouped_clc_kernel_equals_its_twin_and_replays_in_a_graph_with_new_rows(torch, bundle, family,
                                                                                       block_scaled):
    """The clc kernel runs eagerly against its twin for every routing; then (unscaled kernels,
    whose arguments the routing does not reshape) one capture of the clc kernel replays each
    routing by rewriting ``offs``/``masked_m`` in place and must equal the twin's eager result."""
    failures = []
    for kernel in _clc_kernels(bundle, torch, family, block_scaled):
        twin, masked = _twin(bundle, kernel), family == "grouped_masked"
        name = _format(kernel) if block_scaled else None
        gen = torch.Generator(device="cuda").manual_seed(4400 + kernel.index)
        groups, n, k = 16, 1032, 512
        m = 640 if masked else TOTAL_M
        a, b, sa, sb = _grouped_operands(torch, kernel, groups, m, n, k, gen)

        def rows_of(sizes):
            t = torch.tensor(sizes, device="cuda")
            return (t.clamp(max=m) if masked else t.cumsum(0)).to(torch.int32)

        out_shape = (groups, m, n) if masked else (m, n)
        eager = []
        for sizes in ROUTINGS:
            rows = rows_of(sizes)
            out = torch.full(out_shape, float("nan"), device="cuda", dtype=torch.bfloat16)
            static = torch.full(out_shape, float("nan"), device="cuda", dtype=torch.bfloat16)
            _grouped_call(bundle, kernel.id, a, b, rows, out, sa, sb, name)
            _grouped_call(bundle, twin.id, a, b, rows, static, sa, sb, name)
            torch.cuda.synchronize()
            # Rows no group owns stay NaN in both: compare NaN positions too.
            if not torch.equal(out.isnan(), static.isnan()) or not torch.equal(out.nan_to_num(), static.nan_to_num()):
                failures.append(f"{kernel.id} {sizes}: differs from {twin.id}")
            eager.append(static)
        if block_scaled:
            continue
        rows = rows_of(ROUTINGS[0])
        out = torch.empty(out_shape, device="cuda", dtype=torch.bfloat16)
        _grouped_call(bundle, kernel.id, a, b, rows, out, None, None, None)  # plan and load outside the capture
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            _grouped_call(bundle, kernel.id, a, b, rows, out, None, None, None)
        for sizes, static in zip(ROUTINGS, eager):
            rows.copy_(rows_of(sizes))
            out.fill_(float("nan"))
            graph.replay()
            torch.cuda.synchronize()
            if not torch.equal(out.isnan(), static.isnan()) or not torch.equal(out.nan_to_num(), static.nan_to_num()):
                failures.append(f"{kernel.id} {sizes}: a graph replay differs from {twin.id}'s eager run")
    assert not failures, "\n".join(failures)

