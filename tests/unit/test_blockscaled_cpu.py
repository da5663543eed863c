"""Block-scaled formats on the CPU: the float64 reference of mxfp8, nvfp4 and mxfp4 against known
values, the hardware scale layout against an independent index computation, and the checks of a
call's scales. No GPU: this is the half of the block-scaled GEMM that can be verified here."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from tilekiln import blockscaled as bs  # noqa: E402
from tilekiln.spec import BLOCK_SCALE_FORMATS  # noqa: E402


# -- element encodings ----------------------------------------------------------------------------


def test_e2m1_rounds_to_nearest_with_ties_to_even_and_saturates():
    x = torch.tensor([0.0, 0.25, 0.3, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, 5.1, 7.0, 100.0, -0.5, -2.9, -6.5])
    want = [0.0, 0.0, 0.5, 1.0, 1.0, 2.0, 2.0, 4.0, 4.0, 6.0, 6.0, 6.0, -0.5, -3.0, -6.0]
    assert bs.e2m1_values(bs.e2m1_codes(x)).tolist() == want


def test_e2m1_codes_are_the_ocp_encoding():
    # sign in bit 3, then two exponent bits and one mantissa bit: 0b0111 = 6, 0b1001 = -0.5
    codes = torch.arange(16, dtype=torch.uint8)
    assert bs.e2m1_values(codes).tolist() == [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0,
                                              -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0]


def test_fp4_packs_the_even_element_into_the_low_nibble():
    codes = torch.tensor([[1, 2, 7, 15]], dtype=torch.uint8)
    packed = bs.pack_fp4(codes)
    assert packed.tolist() == [[0x21, 0xF7]]
    assert torch.equal(bs.unpack_fp4(packed), codes)


def test_e8m0_is_a_biased_power_of_two():
    scales = bs.e8m0(torch.tensor([0, 1, -3, 127, -127]))
    assert scales.view(torch.uint8).tolist() == [127, 128, 124, 254, 0]
    assert bs.e8m0_values(scales).tolist() == [1.0, 2.0, 0.125, 2.0 ** 127, 2.0 ** -127]
    assert torch.isnan(bs.e8m0_values(torch.tensor([255], dtype=torch.uint8).view(torch.float8_e8m0fnu))).all()


# -- quantization against known values ------------------------------------------------------------


def test_mxfp8_scale_is_the_shared_exponent_of_the_block():
    # amax 10: floor(log2 10) = 3, minus e4m3's emax 8: scale 2**-5; elements x * 32.
    x = torch.zeros(1, 32, dtype=torch.float64)
    x[0, :4] = torch.tensor([10.0, -1.0, 0.5, 3.0])
    elements, scales = bs.quantize(x, "mxfp8")
    assert scales.dtype == torch.float8_e8m0fnu and scales.view(torch.uint8).tolist() == [[127 - 5]]
    assert elements.dtype == torch.float8_e4m3fn
    assert elements.double()[0, :4].tolist() == [320.0, -32.0, 16.0, 96.0]
    assert torch.equal(bs.dequantize(elements, scales, "mxfp8")[0, :4], x[0, :4])


def test_mxfp8_saturates_at_448_and_rounds_elements_to_e4m3():
    # amax 500: scale 2**(8 - 8) = 1, so 500 saturates to 448; 17 rounds to 16 (ties to even).
    x = torch.zeros(1, 32, dtype=torch.float64)
    x[0, :2] = torch.tensor([500.0, 17.0])
    elements, scales = bs.quantize(x, "mxfp8")
    assert bs.e8m0_values(scales).tolist() == [[1.0]]
    assert elements.double()[0, :2].tolist() == [448.0, 16.0]


def test_an_all_zero_block_gets_the_smallest_scale_and_zero_elements():
    for name in BLOCK_SCALE_FORMATS:
        block = BLOCK_SCALE_FORMATS[name].scale.block
        elements, scales = bs.quantize(torch.zeros(2, block), name)
        assert (bs.dequantize(elements, scales, name) == 0).all(), name


def test_mxfp4_scale_and_elements():
    # amax 6: floor(log2 6) = 2, minus e2m1's emax 2: scale 1; 2.6 rounds to 3, -0.7 to -0.5.
    x = torch.zeros(1, 32, dtype=torch.float64)
    x[0, :3] = torch.tensor([6.0, 2.6, -0.7])
    elements, scales = bs.quantize(x, "mxfp4")
    assert scales.view(torch.uint8).tolist() == [[127]] and elements.dtype == torch.uint8
    assert bs.dequantize(elements, scales, "mxfp4")[0, :3].tolist() == [6.0, 3.0, -0.5]
    # amax 96: scale 2**(6 - 2) = 16; 96 / 16 = 6, 20 / 16 = 1.25 -> 1 (ties to even).
    x[0, :3] = torch.tensor([96.0, 20.0, 0.0])
    elements, scales = bs.quantize(x, "mxfp4")
    assert bs.e8m0_values(scales).tolist() == [[16.0]]
    assert bs.dequantize(elements, scales, "mxfp4")[0, :3].tolist() == [96.0, 16.0, 0.0]


def test_nvfp4_scale_is_amax_over_6_in_e4m3():
    # amax 12: scale 2 (exact in e4m3); 12 / 2 = 6, 5 / 2 = 2.5 -> 2, -1 / 2 = -0.5.
    x = torch.zeros(1, 16, dtype=torch.float64)
    x[0, :3] = torch.tensor([12.0, 5.0, -1.0])
    elements, scales = bs.quantize(x, "nvfp4")
    assert scales.dtype == torch.float8_e4m3fn and scales.double().tolist() == [[2.0]]
    assert bs.dequantize(elements, scales, "nvfp4")[0, :3].tolist() == [12.0, 4.0, -1.0]
    # amax 7: 7 / 6 = 1.1667 rounds to e4m3 1.125; 7 / 1.125 = 6.22 saturates to 6.
    x[0, :3] = torch.tensor([7.0, 0.0, 0.0])
    elements, scales = bs.quantize(x, "nvfp4")
    assert scales.double().tolist() == [[1.125]]
    assert bs.dequantize(elements, scales, "nvfp4")[0, 0].item() == 6.75


def test_e5m3_codes_are_unsigned_with_exponent_bias_15():
    """The values MLIR's fnv8E5M3FNU gives each code in the pinned DSL (tilekiln/blockscaled.py)."""
    codes = torch.tensor([0x00, 0x01, 0x07, 0x08, 0x78, 0x79, 0x80, 0xF8, 0xFE], dtype=torch.uint8)
    assert bs.e5m3_values(codes).tolist() == [0.0, 2.0 ** -17, 7 * 2.0 ** -17, 2.0 ** -14, 1.0, 1.125, 2.0,
                                              2.0 ** 16, 114688.0]
    assert bs.e5m3_values(torch.tensor([0xFF], dtype=torch.uint8)).isnan().all()


def test_e5m3_rounds_up_and_saturates():
    x = torch.tensor([0.0, 1.0, 1.01, 1.125, 2.0 ** -17, 3e-6, 114688.0, 1e9], dtype=torch.float64)
    assert bs.e5m3_codes(x).tolist() == [0x00, 0x78, 0x79, 0x79, 0x01, 0x01, 0xFE, 0xFE]
    with pytest.raises(ValueError, match="unsigned"):
        bs.e5m3_codes(torch.tensor([-1.0]))


def test_fp4_e5m3_scale_is_amax_over_6_rounded_up_so_nothing_saturates():
    # amax 7: 7 / 6 = 1.1667 rounds up to e5m3 1.25; 7 / 1.25 = 5.6 -> 6, dequantized 7.5.
    x = torch.zeros(1, 32, dtype=torch.float64)
    x[0, :3] = torch.tensor([7.0, 2.5, -1.0])
    elements, scales = bs.quantize(x, "fp4-e5m3-b32")
    assert scales.dtype == torch.uint8 and scales.tolist() == [[0x7A]]
    assert bs.e5m3_values(scales).tolist() == [[1.25]]
    assert bs.dequantize(elements, scales, "fp4-e5m3-b32")[0, :3].tolist() == [7.5, 2.5, -1.25]


def test_fp4_e5m3_scales_are_uint8_codes_in_the_blocked_layout():
    a, b, sa, sb, _ = _fp4_operands("fp4-e5m3-b32")
    bs.check_block_scales(a, b, sa, sb, "fp4-e5m3-b32")
    assert sa.dtype == torch.uint8 == bs.scale_dtype("fp4-e5m3-b32")
    with pytest.raises(ValueError, match=r"scale_a: dtype torch\.float8_e4m3fn, not torch\.uint8"):
        bs.check_block_scales(a, b, sa.view(torch.float8_e4m3fn), sb, "fp4-e5m3-b32")


def test_an_fp4_e5m3_call_asks_for_the_e5m3_block_scale():
    assert bs.block_request("fp4-e5m3-b32") == (("block_scale", "sfe5m3x32"),)
    assert bs.requested_format(bs.block_request("fp4-e5m3-b32"), torch.float4_e2m1fn_x2) == "fp4-e5m3-b32"
    assert bs.requested_format(bs.block_request("mxfp4"), torch.float4_e2m1fn_x2) == "mxfp4"


@pytest.mark.parametrize("name", sorted(BLOCK_SCALE_FORMATS))
def test_quantization_error_is_within_half_an_element_step(name):
    g = torch.Generator().manual_seed(7)
    # Magnitudes whose nvfp4 scales (amax / 6) are normal e4m3 numbers; smaller ones need the
    # per-tensor scale nvfp4 recipes put in front, which is the caller's.
    x = torch.randn(8, 256, generator=g, dtype=torch.float64) * torch.logspace(0, 2, 8, dtype=torch.float64)[:, None]
    elements, scales = bs.quantize(x, name)
    block = BLOCK_SCALE_FORMATS[name].scale.block
    err = (bs.dequantize(elements, scales, name) - x).abs()
    # Relative to each block's largest magnitude: e4m3 keeps 3 mantissa bits (2**-4 of a step
    # near amax, saturation at 448 of [256, 512)), e2m1 one.
    amax = x.abs().reshape(8, -1, block).amax(-1).repeat_interleave(block, -1)
    bound = 0.125 if BLOCK_SCALE_FORMATS[name].data.value == "e4m3" else 0.25
    assert (err <= bound * amax + 1e-300).all()


def test_reference_mm_is_the_product_of_the_dequantized_operands():
    g = torch.Generator().manual_seed(3)
    a, w = torch.randn(5, 64, generator=g), torch.randn(3, 64, generator=g)
    qa, sa = bs.quantize(a, "mxfp8")
    qw, sw = bs.quantize(w, "mxfp8")
    got = bs.reference_mm(qa, sa, qw, sw, "mxfp8")
    want = torch.zeros(5, 3, dtype=torch.float64)
    da, dw = bs.dequantize(qa, sa, "mxfp8"), bs.dequantize(qw, sw, "mxfp8")
    for i in range(5):
        for j in range(3):
            want[i, j] = sum(da[i, k].item() * dw[j, k].item() for k in range(64))
    assert torch.allclose(got, want, rtol=1e-12, atol=1e-12)


# -- the hardware layout --------------------------------------------------------------------------


def _offset(row: int, block: int, blocks: int) -> int:
    """Byte offset of scale (row, block) in the tcgen05 layout, from the PTX ISA's description of
    the scale-factor atom: 128-row x 4-block atoms of 512 B in row-band-major order, and in an
    atom 32 lines of 16 B, line r % 32 holding rows r % 32 + 32 q for q = 0..3, 4 blocks each."""
    groups = -(-blocks // 4)
    atom = (row // 128) * groups + block // 4
    return atom * 512 + (row % 32) * 16 + ((row % 128) // 32) * 4 + block % 4


@pytest.mark.parametrize("rows,blocks", [(1, 1), (128, 4), (130, 5), (300, 12), (77, 3)])
def test_to_blocked_puts_each_scale_where_the_hardware_reads_it(rows, blocks):
    g = torch.Generator().manual_seed(rows * 31 + blocks)
    scales = torch.randint(1, 255, (rows, blocks), generator=g, dtype=torch.uint8).view(torch.float8_e8m0fnu)
    blocked = bs.to_blocked(scales)
    assert blocked.dtype == scales.dtype and blocked.is_contiguous()
    assert tuple(blocked.shape) == (-(-rows // 128), -(-blocks // 4), 32, 4, 4)
    flat = blocked.view(torch.uint8).flatten()
    raw = scales.view(torch.uint8)
    seen = set()
    for r in range(rows):
        for b in range(blocks):
            at = _offset(r, b, blocks)
            assert flat[at].item() == raw[r, b].item(), (r, b, at)
            seen.add(at)
    # every other byte is padding, zero
    assert all(flat[i].item() == 0 for i in range(flat.numel()) if i not in seen)
    assert torch.equal(bs.from_blocked(blocked, rows, blocks).view(torch.uint8), raw)


def test_blocked_shape_counts_whole_atoms():
    assert bs.blocked_shape(129, 256, "mxfp8") == (2, 2, 32, 4, 4)
    assert bs.blocked_shape(128, 256, "nvfp4") == (1, 4, 32, 4, 4)
    assert bs.blocked_shape(1, 128, "mxfp4") == (1, 1, 32, 4, 4)


# -- a call's checks ------------------------------------------------------------------------------


def _operands(m=130, n=200, k=256):
    a = torch.zeros(m, k, dtype=torch.float8_e4m3fn)
    w = torch.zeros(n, k, dtype=torch.float8_e4m3fn)
    sa = bs.to_blocked(torch.zeros(m, k // 32, dtype=torch.float8_e8m0fnu))
    sw = bs.to_blocked(torch.zeros(n, k // 32, dtype=torch.float8_e8m0fnu))
    return a, w.t(), sa, sw


def test_well_formed_scales_pass():
    bs.check_block_scales(*_operands(), "mxfp8")


@pytest.mark.parametrize("change,match", [
    (lambda a, b, sa, sb: (a, b, sa.view(torch.uint8), sb), r"scale_a: dtype torch\.uint8, not torch\.float8_e8m0fnu"),
    (lambda a, b, sa, sb: (a, b, sa, sb[:1]), r"scale_b: shape \[1, 2, 32, 4, 4\], not \[2, 2, 32, 4, 4\]"),
    (lambda a, b, sa, sb: (a, b, bs.from_blocked(sa, 130, 8), sb), r"scale_a: shape \[130, 8\].*to_blocked"),
    (lambda a, b, sa, sb: (a, b, sa.transpose(2, 3), sb), r"scale_a: shape \[2, 2, 4, 32, 4\]"),
    (lambda a, b, sa, sb: (a, b, sa, sb.permute(1, 0, 2, 3, 4).contiguous().permute(1, 0, 2, 3, 4)),
     r"scale_b: strides .* not contiguous"),
    (lambda a, b, sa, sb: (a, b, 1.0, sb), r"scale_a: expected a torch\.float8_e8m0fnu CUDA tensor"),
    (lambda a, b, sa, sb: (a[:, :96], b[:96], sa, sb), r"a: K = 96 is not a multiple of 128"),
    (lambda a, b, sa, sb: (a, b.t().contiguous().t().contiguous(), sa, sb), r"b: mxfp8 scaled_gemm takes b K-major"),
    (lambda a, b, sa, sb: (a[None], b, sa, sb), r"a: mxfp8 scaled_gemm takes 2-D operands"),
])
def test_malformed_scales_are_refused_naming_the_argument(change, match):
    args = change(*_operands())
    with pytest.raises((ValueError, TypeError), match=match):
        bs.check_block_scales(*args, "mxfp8")


def test_an_unknown_format_is_refused():
    with pytest.raises(ValueError, match="scale_format: 'fp6' is not a block-scaled format"):
        bs.format_of("fp6")


# -- the runtime's choice and refusals ------------------------------------------------------------


def _record(index, kernel_id, **config):
    import dataclasses

    from tests.records import kernel_record

    record = kernel_record(index, kernel_id, (128, 256, 128), dtypes=("e4m3", "e4m3", "f32", "bf16"), div=16)
    return dataclasses.replace(record, config=dataclasses.replace(record.config, pipeline="sm100", **config))


def _problem(requested):
    from tilekiln._tensors import Operand
    from tilekiln.problem import make_problem

    a = Operand("a", (256, 512), (512, 1), "e4m3", 1 << 20, 0, None)
    b = Operand("b", (512, 384), (1, 512), "e4m3", 1 << 21, 0, None)
    return make_problem(a, b, None, "bf16", requested)


def test_an_mxfp8_call_runs_only_on_an_mxfp8_kernel():
    from tilekiln.select import check_kernel
    from tilekiln.spec import BlockScale, DType

    mx = _record(0, "mx", block_scale=BlockScale(DType("e8m0"), 32))
    dense = _record(1, "dense")
    asked = _problem(bs.block_request("mxfp8"))
    assert bs.block_request("mxfp8") == (("block_scale", "sfe8m0x32"),)
    assert check_kernel(mx, asked) is None
    assert check_kernel(dense, asked) == "block_scale: kernel computes None, the call asks for sfe8m0x32"
    # and a per-tensor scaled call never runs on the block-scaled kernel
    assert check_kernel(mx, _problem(())) == "block_scale: kernel computes sfe8m0x32, the call asks for None"
    assert check_kernel(dense, _problem(())) is None
    assert bs.requested_format(bs.block_request("mxfp8"), torch.float8_e4m3fn) == "mxfp8"
    assert bs.requested_format((), torch.float8_e4m3fn) is None


def test_a_bundle_without_block_scaled_kernels_refuses_with_the_arch_message(tmp_path):
    from tilekiln._torch.scales import check_block_kernels
    from tilekiln.bundle import Bundle, DeviceInfo
    from tilekiln.errors import NoKernelError
    from tests.records import manifest

    hopper = Bundle(tmp_path, manifest((_record(0, "dense"),)),
                    device_query=lambda ordinal: DeviceInfo(ordinal, (9, 0), 132, "NVIDIA H200", 143156))
    with pytest.raises(NoKernelError, match=r"scale_format='mxfp8': bundle sm90a \(sm_90a\) has no mxfp8 kernels; "
                                            r"the block-scaled tcgen05 MMA exists on compute capability 10\.x"):
        check_block_kernels(hopper, "mxfp8")


def test_scale_format_names_the_block_scaled_formats():
    from tilekiln.blockwise import scale_format_token

    names = ("mxfp8", "nvfp4", "mxfp4", "fp4-e5m3-b32")
    assert [scale_format_token(name) for name in names] == list(names)
    with pytest.raises(ValueError, match="'tensor', 'rowwise', 'blockwise', 'mxfp8', 'nvfp4', 'mxfp4', 'fp4-e5m3-b32'"):
        scale_format_token("mx")


def test_elements_of_another_type_are_refused():
    a, b, sa, sb = _operands()
    with pytest.raises(TypeError, match=r"a: mxfp8 takes torch\.float8_e4m3fn elements, got torch\.bfloat16"):
        bs.check_block_scales(a.to(torch.bfloat16), b, sa, sb, "mxfp8")


def test_an_mxfp8_call_asks_for_its_block_scale_and_its_bias():
    from tilekiln._torch.scales import scaled_request

    a, b, _, _ = _operands()
    assert scaled_request(a, b, "mxfp8", None, None, None) == (("block_scale", "sfe8m0x32"),)
    bias = torch.zeros(b.shape[1], dtype=torch.float32)
    assert scaled_request(a, b, "mxfp8", None, None, bias) == (("block_scale", "sfe8m0x32"), ("bias", "f32"))


# -- packed fp4 operands --------------------------------------------------------------------------


def _fp4_operands(name, m=130, n=200, k=256, seed=0):
    """Packed ``a`` (M, K/2), ``b`` = the packed weight's transpose (K/2, N), their blocked scales,
    and the unpacked codes and row-major scales they came from."""
    gen = torch.Generator().manual_seed(seed)
    x, w = torch.randn(m, k, generator=gen), torch.randn(n, k, generator=gen)
    a, sa = bs.quantize_operand(x.to(torch.bfloat16), name)
    wq, sw = bs.quantize_operand(w.to(torch.bfloat16), name)
    return a, wq.t(), bs.to_blocked(sa), bs.to_blocked(sw), (x, sa, w, sw)


@pytest.mark.parametrize("name", ["nvfp4", "mxfp4"])
def test_quantize_operand_packs_two_e2m1_elements_per_byte(name):
    x = torch.randn(3, 64, generator=torch.Generator().manual_seed(1))
    codes, scales = bs.quantize(x, name)
    packed, packed_scales = bs.quantize_operand(x, name)
    assert packed.dtype == torch.float4_e2m1fn_x2 and packed.shape == (3, 32) and packed.is_contiguous()
    assert torch.equal(packed_scales.view(torch.uint8), scales.view(torch.uint8))
    raw = packed.view(torch.uint8)
    assert torch.equal(raw & 15, codes[:, 0::2]) and torch.equal(raw >> 4, codes[:, 1::2])
    assert torch.equal(bs.dequantize(packed, scales, name), bs.dequantize(codes, scales, name))


def test_quantize_operand_leaves_mxfp8_elements_as_they_are():
    x = torch.randn(2, 64, generator=torch.Generator().manual_seed(2))
    elements, _ = bs.quantize_operand(x, "mxfp8")
    assert elements.dtype == torch.float8_e4m3fn and elements.shape == (2, 64)


@pytest.mark.parametrize("name", ["nvfp4", "mxfp4"])
def test_the_packed_reference_product_is_the_unpacked_one_and_near_the_float64_product(name):
    a, b, _, _, (x, sa, w, sw) = _fp4_operands(name)
    ref = bs.reference_mm(a, sa, b.t(), sw, name)
    codes_a, _ = bs.quantize(x.to(torch.bfloat16), name)
    codes_w, _ = bs.quantize(w.to(torch.bfloat16), name)
    assert torch.equal(ref, bs.reference_mm(codes_a, sa, codes_w, sw, name))
    exact = x.double() @ w.double().t()
    # fp4 keeps about one bit of mantissa: each product within 25 % of the operands' scale.
    assert ((ref - exact).norm(dim=1) / exact.norm(dim=1)).max() < 0.25


def test_a_packed_operand_is_described_in_e2m1_elements():
    from tilekiln._tensors import describe

    a, b, _, _, _ = _fp4_operands("nvfp4", m=130, n=200, k=256)
    da, db = describe(a, "a"), describe(b, "b")
    assert (da.shape, da.strides, da.dtype) == ((130, 256), (256, 1), "e2m1")
    assert (db.shape, db.strides, db.dtype) == ((256, 200), (1, 256), "e2m1")
    assert da.ptr == a.data_ptr() and db.ptr == b.data_ptr()


def test_a_packed_operand_without_a_unit_stride_is_refused_naming_it():
    from tilekiln._tensors import describe

    a, _, _, _, _ = _fp4_operands("nvfp4")
    with pytest.raises(ValueError, match=r"a: a torch\.float4_e2m1fn_x2 tensor packs two elements along a unit-stride"):
        describe(a[:, ::2], "a")


@pytest.mark.parametrize("name", ["nvfp4", "mxfp4"])
def test_well_formed_fp4_operands_and_scales_pass(name):
    a, b, sa, sb, _ = _fp4_operands(name)
    bs.check_block_scales(a, b, sa, sb, name)
    assert sa.dtype == bs.scale_dtype(name) and sa.shape == bs.blocked_shape(130, 256, name)


def _copied(t):
    """A contiguous float4_e2m1fn_x2 copy of ``t`` (torch copies no fp4 tensor itself)."""
    return t.view(torch.uint8).contiguous().view(torch.float4_e2m1fn_x2)


@pytest.mark.parametrize("name, change, error, match", [
    ("nvfp4", lambda a, b, sa, sb: (a.view(torch.uint8), b, sa, sb), TypeError,
     r"a: nvfp4 takes torch\.float4_e2m1fn_x2 elements packed two per byte, got torch\.uint8; .*quantize_operand"),
    ("mxfp4", lambda a, b, sa, sb: (a, b.t().contiguous().view(torch.uint8).t(), sa, sb), TypeError,
     r"b: mxfp4 takes torch\.float4_e2m1fn_x2 elements"),
    ("nvfp4", lambda a, b, sa, sb: (a[:, :48], b[:48], sa, sb), ValueError,
     r"a: K = 96 \(a\.shape\[1\] = 48 bytes of two elements\) is not a multiple of 64"),
    ("mxfp4", lambda a, b, sa, sb: (a[:, :96], b[:96], sa, sb), ValueError, r"a: K = 192 .* is not a multiple of 128"),
    ("nvfp4", lambda a, b, sa, sb: (a, b, sa.view(torch.float8_e8m0fnu), sb), ValueError,
     r"scale_a: dtype torch\.float8_e8m0fnu, not torch\.float8_e4m3fn"),
    ("mxfp4", lambda a, b, sa, sb: (a, b, sa, sb.view(torch.float8_e4m3fn)), ValueError,
     r"scale_b: dtype torch\.float8_e4m3fn, not torch\.float8_e8m0fnu"),
    ("nvfp4", lambda a, b, sa, sb: (a, b, sa[:, :2], sb), ValueError,
     r"scale_a: shape \[2, 2, 32, 4, 4\], not \[2, 4, 32, 4, 4\]"),
    ("nvfp4", lambda a, b, sa, sb: (_copied(a.view(torch.uint8).t()).t(), b, sa, sb), ValueError,
     r"a: nvfp4 scaled_gemm takes a row-major \(M, K / 2\) float4_e2m1fn_x2 tensor"),
    ("mxfp4", lambda a, b, sa, sb: (a, _copied(b), sa, sb), ValueError, r"b: mxfp4 scaled_gemm takes b K-major"),
])
def test_malformed_fp4_calls_are_refused_naming_the_argument(name, change, error, match):
    args = change(*_fp4_operands(name)[:4])
    with pytest.raises(error, match=match):
        bs.check_block_scales(*args, name)


def test_mxfp4_and_mxfp8_share_a_block_scale_and_the_elements_tell_them_apart():
    from tilekiln._torch.scales import scaled_request

    assert bs.block_request("mxfp4") == bs.block_request("mxfp8") != bs.block_request("nvfp4")
    request = bs.block_request("mxfp4")
    assert bs.requested_format(request, torch.float4_e2m1fn_x2) == "mxfp4"
    assert bs.requested_format(request, torch.float8_e4m3fn) == "mxfp8"
    assert bs.requested_format(bs.block_request("nvfp4"), torch.float4_e2m1fn_x2) == "nvfp4"
    a, b, _, _, _ = _fp4_operands("mxfp4")
    assert scaled_request(a, b, "mxfp4", None, None, None) == (("block_scale", "sfe8m0x32"),)
    # An mxfp8 call of fp4 elements (or the reverse) is refused before a kernel is chosen.
    with pytest.raises(TypeError, match=r"a: mxfp8 takes torch\.float8_e4m3fn elements, got torch\.float4_e2m1fn_x2"):
        scaled_request(a, b, "mxfp8", None, None, None)
    a8, b8, _, _ = _operands()
    with pytest.raises(TypeError, match=r"a: mxfp4 takes torch\.float4_e2m1fn_x2 elements packed two per byte"):
        scaled_request(a8, b8, "mxfp4", None, None, None)


def test_an_nvfp4_call_runs_only_on_an_nvfp4_kernel():
    from tilekiln._tensors import describe
    from tilekiln.problem import make_problem
    from tilekiln.select import check_kernel
    from tilekiln.spec import BlockScale, DType, DTypes

    import dataclasses

    a, b, _, _, _ = _fp4_operands("nvfp4", m=256, n=384, k=512)
    # Described as scaled_gemm describes them, placed on a device (make_problem refuses host memory).
    a_op, b_op = (dataclasses.replace(describe(t, name), device=0) for t, name in ((a, "a"), (b, "b")))
    asked = make_problem(a_op, b_op, None, "bf16", bs.block_request("nvfp4"))
    e2m1 = DTypes(DType("e2m1"), DType("e2m1"), DType("f32"), DType("bf16"))
    nv = _record(0, "nv", block_scale=BlockScale(DType("e4m3"), 16), dtypes=e2m1)
    mx4 = _record(1, "mx4", block_scale=BlockScale(DType("e8m0"), 32), dtypes=e2m1)
    assert (asked.m, asked.n, asked.k) == (256, 384, 512)
    assert check_kernel(nv, asked) is None
    assert check_kernel(mx4, asked) == "block_scale: kernel computes sfe8m0x32, the call asks for sfe4m3x16"


# -- block-scaled SwiGLU (scaled_gemm(..., activation="swiglu")) ------------------------------------


def _swiglu_problem(name, n):
    """A ``scale_format=name`` call with activation swiglu of 256 rows, N = ``n`` (2I) and K 512, as
    scaled_gemm describes its operands (on a device: make_problem refuses host memory)."""
    import dataclasses

    from tilekiln._tensors import describe
    from tilekiln._torch.scales import scaled_request
    from tilekiln.problem import make_problem

    a, b, _, _, _ = _fp4_operands(name, m=256, n=n, k=512) if name != "mxfp8" else (*_operands(256, n, 512), None)
    request = scaled_request(a, b, name, None, None, None, None, "swiglu")
    a_op, b_op = (dataclasses.replace(describe(t, label), device=0) for t, label in ((a, "a"), (b, "b")))
    return make_problem(a_op, b_op, None, "bf16", request)


@pytest.mark.parametrize("name,scale,dtype", [("mxfp8", ("e8m0", 32), "e4m3"), ("nvfp4", ("e4m3", 16), "e2m1")])
def test_a_block_scaled_swiglu_call_runs_on_the_fused_kernel_else_pairs_in_torch(name, scale, dtype):
    from tests.records import pick
    from tilekiln.select import check_kernel, choose, choose_fused
    from tilekiln.spec import Activation, BlockScale, DType, DTypes

    config = {"block_scale": BlockScale(DType(scale[0]), scale[1]),
              "dtypes": DTypes(DType(dtype), DType(dtype), DType("f32"), DType("bf16"))}
    gated = _record(0, "gated", activation=Activation.SWIGLU, **config)
    plain = _record(1, "plain", **config)
    dense_gated = _record(2, "dense_gated", activation=Activation.SWIGLU,
                          dtypes=DTypes(DType(dtype), DType(dtype), DType("f32"), DType("bf16")))
    asked = _swiglu_problem(name, 384)
    assert asked.requested == (("block_scale", f"sf{scale[0]}x{scale[1]}"), ("activation", "swiglu"))
    assert (asked.n, asked.out_n) == (384, 192)
    assert check_kernel(gated, asked) is None
    assert check_kernel(plain, asked) == "activation: kernel computes none, the call asks for swiglu"
    assert check_kernel(dense_gated, asked).startswith("block_scale: kernel computes None")
    kernels = (plain, gated, dense_gated)
    choice, unfused = choose_fused(lambda p: choose(kernels, p, 148, pick()), asked)
    assert (choice.kernel.id, unfused) == ("gated", ())
    # I = 160 is not a multiple of the 64-row gate and up blocks: the ungated block-scaled GEMM, and
    # torch pairs its columns.
    choice, unfused = choose_fused(lambda p: choose(kernels, p, 148, pick()), _swiglu_problem(name, 320))
    assert (choice.kernel.id, unfused) == ("plain", (("activation", "swiglu"),))


def test_a_scaled_swiglu_call_is_refused_where_it_cannot_pair_columns():
    from tilekiln._torch.checks import scaled_activation_token
    from tilekiln._torch.scales import scaled_request

    a, b, _, _ = _operands(n=200)
    assert scaled_activation_token(None) == "none" and scaled_activation_token("swiglu") == "swiglu"
    with pytest.raises(ValueError, match=r"activation: scaled_gemm takes None or 'swiglu', got 'relu'"):
        scaled_activation_token("relu")
    with pytest.raises(ValueError, match=r"activation: 'swiglu' pairs gate and up columns of b, so N must be even; "
                                         r"got N = 199"):
        scaled_request(a, b[:, :199], "mxfp8", None, None, None, None, "swiglu")
    one = torch.ones(1)
    with pytest.raises(ValueError, match=r"activation: 'swiglu' with a torch\.float8_e4m3fn result"):
        scaled_request(a, b, "tensor", torch.float8_e4m3fn, None, None, one, "swiglu")


def test_a_traced_scaled_swiglu_call_allocates_half_the_columns():
    from tilekiln._torch.ops import _scaled_gemm_fake

    a, b, sa, sb = _operands(n=256)
    out = _scaled_gemm_fake(a, b, sa, sb, None, "", "", "mxfp8", None, None, "swiglu")
    assert (tuple(out.shape), out.dtype) == ((130, 128), torch.bfloat16)
    assert tuple(_scaled_gemm_fake(a, b, sa, sb, None, "", "", "mxfp8").shape) == (130, 256)


# -- fp16 output (scaled_gemm(..., out_dtype=torch.float16)) ---------------------------------------


def _blackwell_bundle(tmp_path, *records):
    """A bundle named sm100a (CC 10.0) holding ``records``, on a stand-in B200."""
    import dataclasses

    from tests.records import manifest
    from tilekiln.bundle import Bundle, DeviceInfo

    m = manifest(records)
    info = dataclasses.replace(m.bundle, name="sm100a", arch="sm_100a", compute_capability=(10, 0))
    return Bundle(tmp_path, dataclasses.replace(m, bundle=info),
                  device_query=lambda ordinal: DeviceInfo(ordinal, (10, 0), 148, "NVIDIA B200", 182630))


def _typed(name, c):
    """The block scale and (A, B, acc, C) types of a ``name`` kernel writing ``c``."""
    from tilekiln.spec import DType, DTypes

    fmt = bs.format_of(name)
    data = fmt.data.value
    return {"block_scale": fmt.scale, "dtypes": DTypes(DType(data), DType(data), DType("f32"), DType(c))}


@pytest.mark.parametrize("name", ["mxfp8", "nvfp4"])
def test_an_fp16_block_scaled_call_runs_only_on_an_fp16_kernel(name):
    import dataclasses

    from tilekiln._tensors import describe
    from tilekiln._torch.scales import scaled_request
    from tilekiln.problem import make_problem
    from tests.records import pick
    from tilekiln.select import check_kernel, choose

    a, b, _, _, _ = _fp4_operands(name, m=256, n=384, k=512) if name != "mxfp8" else (*_operands(256, 384, 512), None)
    request = scaled_request(a, b, name, torch.float16, None, None)
    assert request == bs.block_request(name)
    a_op, b_op = (dataclasses.replace(describe(t, label), device=0) for t, label in ((a, "a"), (b, "b")))
    asked = make_problem(a_op, b_op, None, "f16", request)
    half, brain = _record(0, "f16", **_typed(name, "f16")), _record(1, "bf16", **_typed(name, "bf16"))
    data = bs.format_of(name).data.value
    assert check_kernel(half, asked) is None
    assert check_kernel(brain, asked) == f"dtype: kernel computes {data}/{data}->bf16, the call needs {data}/{data}->f16"
    assert choose((brain, half), asked, 148, pick()).kernel.id == "f16"
    # and a bf16 call never runs on the fp16 kernel
    bf16_call = make_problem(a_op, b_op, None, "bf16", request)
    assert choose((brain, half), bf16_call, 148, pick()).kernel.id == "bf16"
    assert check_kernel(half, bf16_call).endswith("->bf16")


def test_an_fp16_result_no_kernel_writes_is_refused_naming_out_dtype(tmp_path):
    from tilekiln._torch.api import scaled_gemm
    from tilekiln._torch.scales import check_block_kernels
    from tilekiln.errors import NoKernelError

    bundle = _blackwell_bundle(tmp_path, _record(0, "mx", **_typed("mxfp8", "bf16")),
                               _record(1, "nv", **_typed("nvfp4", "f16")))
    message = (r"out_dtype: scale_format='mxfp8' with a torch\.float16 result: bundle sm100a \(sm_100a\) has no mxfp8 "
               r"kernel writing f16 \(its mxfp8 kernels write bf16\); pass out_dtype=torch\.bfloat16")
    with pytest.raises(NoKernelError, match=message):
        check_block_kernels(bundle, "mxfp8", torch.float16)
    # through scaled_gemm, before any operand is placed on a device: never a bf16 result
    a, b, sa, sb = _operands(256, 384, 512)
    with pytest.raises(NoKernelError, match=message):
        scaled_gemm(bundle, a, b, sa, sb, torch.float16, None, None, scale_format="mxfp8")
    # an out= tensor's type is the result's, without out_dtype too
    half = torch.empty(256, 384, dtype=torch.float16)
    for out_dtype in (torch.float16, None):
        with pytest.raises(NoKernelError, match=message):
            scaled_gemm(bundle, a, b, sa, sb, out_dtype, half, None, scale_format="mxfp8")
    with pytest.raises(NoKernelError, match=r"out_dtype: scale_format='mxfp8' with a torch\.float32 result"):
        check_block_kernels(bundle, "mxfp8", torch.float32)
    # the types the format's kernels write pass; the nvfp4 kernel writes f16 only
    check_block_kernels(bundle, "mxfp8", torch.bfloat16)
    check_block_kernels(bundle, "nvfp4", torch.float16)
    with pytest.raises(NoKernelError, match=r"pass out_dtype=torch\.float16, or build a kernel"):
        check_block_kernels(bundle, "nvfp4", torch.bfloat16)


def test_an_fp16_swiglu_call_without_an_fp16_gated_kernel_pairs_an_fp16_result_in_torch():
    """A bf16 gated kernel never serves an fp16 call: the fp16 GEMM runs and torch pairs its columns."""
    import dataclasses

    from tests.records import pick
    from tilekiln.select import choose, choose_fused
    from tilekiln.spec import Activation

    asked = _swiglu_problem("mxfp8", 384)
    asked = dataclasses.replace(asked, out_dtype="f16")
    gated_bf16 = _record(0, "gated_bf16", activation=Activation.SWIGLU, **_typed("mxfp8", "bf16"))
    plain_f16 = _record(1, "plain_f16", **_typed("mxfp8", "f16"))
    kernels = (gated_bf16, plain_f16)
    choice, unfused = choose_fused(lambda p: choose(kernels, p, 148, pick()), asked)
    assert (choice.kernel.id, unfused) == ("plain_f16", (("activation", "swiglu"),))
    gated_f16 = _record(2, "gated_f16", activation=Activation.SWIGLU, **_typed("mxfp8", "f16"))
    choice, unfused = choose_fused(lambda p: choose(kernels + (gated_f16,), p, 148, pick()), asked)
    assert (choice.kernel.id, unfused) == ("gated_f16", ())


def test_a_pair_swiglu_kernel_takes_the_block_scaled_swiglu_call():
    """The CTA-pair SwiGLU kernel (cluster 2x1, cta_group 2) accepts what its 1-CTA twin accepts: its
    tile pairs the same gate and up blocks."""
    from tilekiln.select import check_kernel
    from tilekiln.spec import Activation, Cluster

    asked = _swiglu_problem("nvfp4", 384)
    pair = _record(0, "pair", activation=Activation.SWIGLU, cluster=Cluster(2, 1), cta_group=2,
                   **_typed("nvfp4", "bf16"))
    assert check_kernel(pair, asked) is None
    assert check_kernel(pair, _swiglu_problem("nvfp4", 320)).startswith("swiglu: I = N/2 = 160")


def test_an_out_tensor_decides_the_result_type_without_out_dtype(tmp_path, monkeypatch):
    """scaled_gemm(..., out=fp16 tensor) plans an fp16 result (as out_dtype=torch.float16 does, and as
    the torch.compile operator passes out's type), not the bf16 default."""
    from tilekiln._torch.api import scaled_gemm

    bundle = _blackwell_bundle(tmp_path, _record(0, "mx16", **_typed("mxfp8", "f16")),
                               _record(1, "mx", **_typed("mxfp8", "bf16")))
    asked = []

    class Planned(Exception):
        pass

    def plan(a, b, out, kernel=None, out_dtype=None, **_):
        asked.append((out.dtype, out_dtype))
        raise Planned

    monkeypatch.setattr(bundle, "plan", plan)
    a, b, sa, sb = _operands(256, 384, 512)
    for out_dtype, result in ((None, torch.float16), (torch.float16, torch.float16), (None, torch.bfloat16)):
        with pytest.raises(Planned):
            scaled_gemm(bundle, a, b, sa, sb, out_dtype, torch.empty(256, 384, dtype=result), None,
                        scale_format="mxfp8")
    assert asked == [("f16", "f16"), ("f16", "f16"), ("bf16", "bf16")]
