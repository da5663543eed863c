"""Block-scaled (mxfp8, nvfp4, and mxfp4 and fp4-e5m3-b32 where a bundle has them) grouped GEMM on
the GPU: every block-scaled grouped kernel, contiguous and masked, against the float64 per-group
product of its dequantized inputs (tilekiln.blockscaled.reference_grouped_mm) over routings with
empty, one-row, tile-sized and tile-straddling groups, NaN-poisoned outputs (a masked call's rows
past each count must keep the NaN); the errors of wrong scales; the refusal on a bundle without such kernels.

    python -m pytest -q tests/gpu/test_blockscaled_grouped.py   (TILEKILN_TEST_BUNDLE: the bundle under test)

On a CC 10.x device with artifacts/sm100a (B200), sm103a (B300) or sm107a (Rubin) the kernels run;
on Hopper (artifacts/sm90a), which has none, only the refusal does.
"""

from __future__ import annotations

import re

import pytest

pytestmark = pytest.mark.gpu

# Every bundle of CC 10.x has mxfp8, nvfp4 and mxfp4 grouped kernels (sm100a: the 32-byte-K MMA; sm107a
# mxfp8 and mxfp4 on the 64-byte K; sm103a also nvfp4 and mxfp4 on the 48-byte K, whose K-slices are 768
# e2m1 elements); fp4-e5m3-b32 only sm107a: its cases skip elsewhere.
FORMATS = ("mxfp8", "nvfp4", "mxfp4", "fp4-e5m3-b32")
# (N, K, rows per group): empty groups, one-row groups, groups smaller than, equal to and just past a
# 128-row tile (so SFA bands are padded), N no tile multiple, K a few scale-factor atoms, and K = 1664
# (two whole 768-element slices of the sm103 kernels and a 128-element tail TMA zero-fills).
ROUTINGS = (
    (256, 128, [100, 0, 1, 300]),
    (256, 1664, [3, 130]),
    (264, 512, [128] * 4),
    (1032, 256, [0, 5, 127, 128, 129, 257, 1, 0]),
    (512, 1024, [1000]),
    (384, 256, [0, 0, 0]),
)


def _kernels(bundle, name, family):
    from tilekiln.spec import BLOCK_SCALE_FORMATS

    fmt = BLOCK_SCALE_FORMATS[name]
    return [k for k in bundle.kernels if k.config.family == family and k.config.block_scale == fmt.scale
            and k.config.dtypes.a == fmt.data]


def _data(torch, shape, block, gen):
    """Normals whose scale blocks differ in magnitude by up to 2^16, so a kernel that read another
    block's (or another group's) scale would be far off."""
    spread = 2.0 ** torch.randint(-8, 9, (*shape[:-1], shape[-1] // block), device="cuda", generator=gen)
    return torch.randn(*shape, device="cuda", generator=gen) * spread.repeat_interleave(block, -1)


def _row_error(torch, got, ref):
    if torch.isnan(got).any():
        return float("nan")
    norms = ref.norm(dim=-1)
    keep = norms > 0
    return ((got.double() - ref).norm(dim=-1)[keep] / norms[keep]).max().item() if keep.any() else 0.0


@pytest.mark.parametrize("masked", [False, True])
@pytest.mark.parametrize("name", FORMATS)
def test_every_block_scaled_grouped_kernel_matches_the_dequantized_float64_product(torch, bundle, name, masked):
    from tilekiln import blockscaled as bs

    family = "grouped_masked" if masked else "grouped"
    kernels = _kernels(bundle, name, family)
    if not kernels or torch.cuda.get_device_capability()[0] != 10:
        pytest.skip(f"needs a bundle with {name} {family} kernels on a compute capability 10.x device")
    block = bs.format_of(name).scale.block
    failures = []
    for kernel in kernels:
        for i, (n, k, rows) in enumerate(ROUTINGS):
            gen = torch.Generator(device="cuda").manual_seed(4100 + 10 * kernel.index + i)
            groups = len(rows)
            w, sw = bs.quantize_operand(_data(torch, (groups, n, k), block, gen), name)
            what = f"{kernel.id} {groups} groups of {'/'.join(map(str, rows))} rows, N {n}, K {k}"
            if masked:
                slots = max(max(rows), 1)
                a, sa = bs.quantize_operand(_data(torch, (groups, slots, k), block, gen), name)
                counts = torch.tensor(rows, dtype=torch.int32, device="cuda")
                out = torch.full((groups, slots, n), float("nan"), device="cuda", dtype=torch.bfloat16)
                bundle.grouped_gemm_masked(a, w.transpose(1, 2), counts, scale_a=bs.to_blocked(sa),
                                           scale_b=bs.to_blocked(sw), out=out, kernel=kernel.id, scale_format=name)
                ref = bs.reference_grouped_mm(a, sa, w, sw, rows, name, masked=True)
                torch.cuda.synchronize()
                if not all(torch.isnan(out[g, r:]).all() for g, r in enumerate(rows)):
                    failures.append(f"{what}: a row past masked_m was written")
                got = torch.cat([out[g, :r] for g, r in enumerate(rows)])
                ref = torch.cat([ref[g, :r] for g, r in enumerate(rows)])
            else:
                total = sum(rows)
                a, sa = bs.quantize_operand(_data(torch, (total, k), block, gen), name)
                offs = torch.tensor(rows, device="cuda").cumsum(0).to(torch.int32)
                got = torch.full((total, n), float("nan"), device="cuda", dtype=torch.bfloat16)
                bundle.grouped_gemm(a, w.transpose(1, 2), offs, scale_a=bs.to_blocked_grouped(sa, offs),
                                    scale_b=bs.to_blocked(sw), out=got, kernel=kernel.id, scale_format=name)
                ref = bs.reference_grouped_mm(a, sa, w, sw, offs, name)
                torch.cuda.synchronize()
            err = _row_error(torch, got, ref)
            if not err < 1e-2:
                failures.append(f"{what}: relative error of the worst row {err:.3g}")
    assert not failures, "\n".join(failures)


def _call(torch, name="mxfp8"):
    from tilekiln import blockscaled as bs

    gen = torch.Generator(device="cuda").manual_seed(4200)
    block = bs.format_of(name).scale.block
    a, sa = bs.quantize_operand(_data(torch, (300, 256), block, gen), name)
    w, sw = bs.quantize_operand(_data(torch, (3, 256, 256), block, gen), name)
    offs = torch.tensor([10, 150, 300], dtype=torch.int32, device="cuda")
    return a, w.transpose(1, 2), offs, bs.to_blocked_grouped(sa, offs), bs.to_blocked(sw)


@pytest.mark.parametrize("change, error, text", [
    (lambda t, sa, sb: (sa.view(t.uint8), sb), ValueError, "scale_a: dtype torch.uint8"),
    (lambda t, sa, sb: (sa[:2], sb), ValueError, "scale_a: shape [2, 2, 32, 4, 4], not [5, 2, 32, 4, 4]"),
    (lambda t, sa, sb: (sa, sb[:1]), ValueError, "scale_b: shape [1, 2, 2, 32, 4, 4], not [3, 2, 2, 32, 4, 4]"),
    (lambda t, sa, sb: (sa.cpu(), sb), ValueError, "scale_a: on cpu, not the inputs' device"),
])
def test_wrong_grouped_scales_raise_naming_the_argument_and_leave_the_device_usable(torch, bundle, change, error,
                                                                                    text):
    if not _kernels(bundle, "mxfp8", "grouped"):
        pytest.skip("the bundle has no mxfp8 grouped kernel")
    a, b, offs, sa, sb = _call(torch)
    with pytest.raises(error, match=re.escape(text)):
        bundle.grouped_gemm(a, b, offs, scale_a=change(torch, sa, sb)[0], scale_b=change(torch, sa, sb)[1],
                            scale_format="mxfp8")
    out = bundle.grouped_gemm(a, b, offs, scale_a=sa, scale_b=sb, scale_format="mxfp8")
    torch.cuda.synchronize()
    assert not torch.isnan(out).any()


def test_a_bundle_without_block_scaled_grouped_kernels_refuses_with_the_arch_message(torch, bundle):
    from tilekiln.errors import NoKernelError

    if _kernels(bundle, "mxfp8", "grouped"):
        pytest.skip("the bundle has mxfp8 grouped kernels")
    a, b, offs, sa, sb = _call(torch)
    with pytest.raises(NoKernelError, match=r"scale_format='mxfp8': bundle .* has no mxfp8 kernels; the block-scaled "
                                            r"tcgen05 MMA exists on compute capability 10\.x"):
        bundle.grouped_gemm(a, b, offs, scale_a=sa, scale_b=sb, scale_format="mxfp8")
