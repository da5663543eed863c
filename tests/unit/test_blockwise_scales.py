"""Blockwise fp8 on the CPU: quantize_fp8_blockwise against a float64 reference, the layouts it
returns, the checks of a call's scales, and the selection that never drops blockwise scaling."""

from __future__ import annotations

import dataclasses

import pytest

torch = pytest.importorskip("torch")

import tilekiln  # noqa: E402
from tilekiln.blockwise import check_scales, dequantize  # noqa: E402
from tilekiln.select import Choice, choose_fused  # noqa: E402
from tilekiln.spec import Scaling, blockwise_b_blocks, blockwise_partials, parse_kernel_id  # noqa: E402

E4M3_MAX = 448.0


def _inputs(rows: int, cols: int, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(rows, cols, generator=g, dtype=torch.float32)
    # Outliers a few hundred times the typical value, in a few places, and an all-zero block.
    x[torch.randint(0, rows, (5,), generator=g), torch.randint(0, cols, (5,), generator=g)] *= 300.0
    x[:1, :128] = 0.0
    return x.to(torch.bfloat16)


def _reference(x: torch.Tensor, block: tuple[int, int], power_of_two: bool):
    """float64: per block, amax / 448 (1 for a zero block), rounded to float32 (optionally up to a
    power of two), and x / scale rounded to e4m3."""
    rows, cols = x.shape
    br = block[0]
    xd = x.double()
    nrb, nkb = -(-rows // br), cols // 128
    scales = torch.empty(nrb, nkb, dtype=torch.float64)
    for i in range(nrb):
        for j in range(nkb):
            amax = xd[i * br:(i + 1) * br, j * 128:(j + 1) * 128].abs().max().item()
            s = amax / E4M3_MAX if amax > 0 else 1.0
            s = float(torch.tensor(s, dtype=torch.float64).float())
            if power_of_two:
                e = 0
                while 2.0 ** e < s:
                    e += 1
                while 2.0 ** (e - 1) >= s:
                    e -= 1
                s = 2.0 ** e
            scales[i, j] = s
    full = scales.repeat_interleave(br, 0)[:rows].repeat_interleave(128, 1)
    q = (xd / full).clamp(-E4M3_MAX, E4M3_MAX).to(torch.float8_e4m3fn)
    return q, scales.float()


@pytest.mark.parametrize("block", [(1, 128), (128, 128)])
@pytest.mark.parametrize("power_of_two", [False, True])
@pytest.mark.parametrize("rows", [1, 77, 256, 300])
def test_quantize_matches_the_float64_reference(block, power_of_two, rows):
    x = _inputs(rows, 384, seed=rows)
    q, scales = tilekiln.quantize_fp8_blockwise(x, block, power_of_two=power_of_two)
    ref_q, ref_scales = _reference(x, block, power_of_two)
    assert q.dtype == torch.float8_e4m3fn and q.shape == x.shape and q.is_contiguous()
    assert scales.dtype == torch.float32
    assert torch.equal(scales, ref_scales)
    assert torch.equal(q.view(torch.uint8), ref_q.view(torch.uint8))
    if power_of_two:
        mantissa, _ = torch.frexp(scales)
        assert bool((mantissa == 0.5).all()), "power-of-two scales"
    # Rounding to e4m3 (3 mantissa bits) costs at most 2^-4 of a value's magnitude, plus half the
    # smallest subnormal step for values far below the block's largest.
    err = (dequantize(q, scales, block) - x.double()).abs()
    bound = x.double().abs() * 2.0 ** -4 + dequantize(torch.ones_like(q), scales, block) * 2.0 ** -10
    assert bool((err <= bound).all())


def test_quantize_layouts_are_the_ones_the_kernel_reads():
    x = _inputs(300, 512, seed=1)
    _, sa = tilekiln.quantize_fp8_blockwise(x, (1, 128))
    assert sa.shape == (300, 4) and sa.stride() == (1, 300), "activation scales are M-major"
    _, sb = tilekiln.quantize_fp8_blockwise(x, (128, 128))
    assert sb.shape == (3, 4) and sb.stride() == (4, 1), "weight scales are row-major (K blocks contiguous)"


def test_each_block_uses_the_e4m3_range():
    x = _inputs(128, 256, seed=2)
    q, scales = tilekiln.quantize_fp8_blockwise(x, (1, 128))
    peak = q.float().abs().reshape(128, 2, 128).amax(dim=2)
    nonzero = x.float().abs().reshape(128, 2, 128).amax(dim=2) > 0
    assert bool((peak[nonzero] == E4M3_MAX).all())
    assert bool((scales[~nonzero] == 1.0).all())


@pytest.mark.parametrize("args, kwargs, error, text", [
    ((torch.zeros(4, 100),), {}, ValueError, "x: 100 columns is not a multiple of 128"),
    ((torch.zeros(4, 128),), {"block": (1, 64)}, ValueError, "block: expected (1, 128)"),
    ((torch.zeros(2, 4, 128),), {}, ValueError, "x: expected a 2-D"),
    ((torch.zeros(4, 128, dtype=torch.int32),), {}, ValueError, "x: expected a 2-D bfloat16"),
    (([[1.0]],), {}, TypeError, "x: expected a torch tensor"),
])
def test_quantize_refuses_bad_input_naming_the_argument(args, kwargs, error, text):
    with pytest.raises(error, match=_literal(text)):
        tilekiln.quantize_fp8_blockwise(*args, **kwargs)


def _literal(text: str) -> str:
    import re

    return re.escape(text)


def _operands(m=300, n=200, k=384):
    a = torch.zeros(m, k, dtype=torch.float8_e4m3fn)
    b = torch.zeros(n, k, dtype=torch.float8_e4m3fn).t()
    sa = torch.ones(k // 128, m).t()
    sb = torch.ones(-(-n // 128), k // 128)
    return a, b, sa, sb


def test_check_scales_accepts_the_documented_layouts_and_returns_their_strides():
    a, b, sa, sb = _operands()
    assert check_scales(a, b, sa, sb) == (300, 900, 3, 6)
    # One K block: any stride along K; one row: any stride along M.
    a1, b1, sa1, sb1 = _operands(m=1, k=128)
    assert check_scales(a1, b1, torch.ones(1, 5)[:, 2:3], torch.ones(2, 3)[:, :1])[0] == 1


@pytest.mark.parametrize("change, error, text", [
    (lambda a, b, sa, sb: (a, b, sa.contiguous(), sb), ValueError, "scale_a: expected a float32 tensor (M, K/128) = (300, 3) "
     "M-major (stride (1, s))"),
    (lambda a, b, sa, sb: (a, b, sa.double(), sb), ValueError, "scale_a: expected a float32 tensor"),
    (lambda a, b, sa, sb: (a, b, sa[:299], sb), ValueError, "got shape [299, 3]"),
    (lambda a, b, sa, sb: (a, b, sa, sb.t().contiguous().t()), ValueError, "scale_b: expected a float32 tensor "
     "(ceil(N/128), K/128) = (2, 3) with K/128 contiguous"),
    (lambda a, b, sa, sb: (a, b, sa, torch.ones(1, 3)), ValueError, "scale_b: expected"),
    (lambda a, b, sa, sb: (a, b, sa, 1.0), TypeError, "scale_b: expected a float32 tensor (ceil(N/128)"),
    (lambda a, b, sa, sb: (a[:, :320], b[:320], sa, sb), ValueError, "a: K = 320 is not a multiple of 128"),
    (lambda a, b, sa, sb: (a[None], b, sa, sb), ValueError, "a: blockwise scaled_gemm takes 2-D operands"),
])
def test_check_scales_refuses_wrong_scales_naming_the_argument(change, error, text):
    with pytest.raises(error, match=_literal(text)):
        check_scales(*change(*_operands()))


def test_scale_format_is_checked_before_anything_runs():
    a, b, sa, sb = _operands()
    with pytest.raises(ValueError, match="scale_format: 'columnwise' is not one of 'tensor', 'rowwise', 'blockwise'"):
        tilekiln.scaled_gemm(a, b, sa, sb, scale_format="columnwise")


def test_blockwise_kernel_ids_round_trip():
    config = parse_kernel_id("gemm_sm90_e4m3_e4m3_f32_bf16_tn_128x128x128_c1x1_blockwise")
    assert config.scaling is Scaling.BLOCKWISE
    assert parse_kernel_id("gemm_sm90_e4m3_e4m3_f32_bf16_tn_128x128x128_c1x1").scaling is Scaling.TENSOR


@pytest.mark.parametrize("tile_n, b_blocks, partials", [
    (16, 1, 2), (64, 1, 2), (128, 1, 2),  # a tile lies in one B scale block: two partial sums
    (192, 2, 1), (256, 2, 1),  # two blocks, split at 64 or 128 columns: one partial sum
    (96, 0, 1), (320, 0, 1)])  # split at 32 or 96, or three blocks: rule BLOCKWISE refuses them
def test_the_b_scale_blocks_a_tile_spans_decide_its_partial_sums(tile_n, b_blocks, partials):
    assert blockwise_b_blocks(128, tile_n) == b_blocks
    assert blockwise_partials(128, tile_n) == partials


@pytest.mark.parametrize("tile_m, tile_n, b_blocks", [
    (64, 16, 1), (64, 64, 1), (128, 32, 1), (128, 192, 1),  # tile M along N, within one block
    (192, 16, 0), (256, 64, 0), (96, 32, 0)])  # rows over two blocks: rule BLOCKWISE refuses them
def test_a_swapped_tile_takes_its_b_scale_blocks_along_its_rows(tile_m, tile_n, b_blocks):
    assert blockwise_b_blocks(tile_m, tile_n, swap_ab=True) == b_blocks
    assert blockwise_partials(tile_m, tile_n, swap_ab=True) == (2 if b_blocks else 1)


def test_every_origin_of_a_two_block_tile_splits_at_64_or_128():
    """What the template's promotion unrolls: a tile's first B block covers 64 or 128 columns."""
    for tile_n in (192, 256):
        splits = {128 - (tn * tile_n) % 128 for tn in range(64)}
        assert splits <= {64, 128}
        assert all(128 - (tn * tile_n) % 128 + 128 >= tile_n for tn in range(64)), "at most two blocks"


@dataclasses.dataclass(frozen=True)
class _Problem:
    requested: tuple = ()


def test_selection_never_drops_blockwise_scaling():
    """An activation no kernel fuses is left to torch; blockwise scaling never is."""
    asked = []

    def choose_for(problem):
        asked.append(problem.requested)
        return Choice(None, "none", ())

    choice, unfused = choose_fused(choose_for, _Problem((("scaling", "blockwise"),)))
    assert choice.kernel is None and unfused == () and asked == [(("scaling", "blockwise"),)]
    asked.clear()
    _, unfused = choose_fused(choose_for, _Problem((("scaling", "blockwise"), ("activation", "silu"))))
    assert asked[-1] == (("scaling", "blockwise"),) and unfused == (("activation", "silu"),)


def test_float_scales_must_start_4_byte_aligned():
    """The kernels read row-wise and blockwise scales, and an fp8 result's scale_result, one float32
    at a time: a view at an odd byte offset is refused naming its argument."""
    from tilekiln._torch.scales import check_float_pointers

    class At:
        def __init__(self, address):
            self.address = address

        def data_ptr(self):
            return self.address

    check_float_pointers(scale_a=At(0x1000), scale_b=At(0x1004), scale_result=At(0x2008))
    for name in ("scale_a", "scale_b", "scale_result"):
        with pytest.raises(ValueError, match=f"^{name}: data pointer is not 4-byte aligned"):
            check_float_pointers(**{name: At(0x1002)})
