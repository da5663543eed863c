"""Block-scaled grouped GEMM on the CPU: the per-group scale layout (to_blocked_grouped) against an
independent index computation, the float64 reference of each format for the contiguous and masked
layouts against known values, the checks of a call's operands and scales (each error naming its
argument), and the refusal of a bundle without block-scaled kernels with the arch message. No GPU:
tests/gpu/test_blockscaled_grouped.py runs the kernels where a CC 10.x device exists."""

from __future__ import annotations

import math

import pytest

torch = pytest.importorskip("torch")

from tilekiln import blockscaled as bs  # noqa: E402


def _raw(blocked, bands, blocks):
    """Row-major (bands * 128, blocks) uint8 of a blocked tensor, by the atom formula of the module
    doc (row r, block j of band b, block group q at byte (r % 32) * 16 + (r // 32) % 4 * 4 + j % 4)."""
    flat = blocked.view(torch.uint8).reshape(-1)
    groups = math.ceil(blocks / 4)
    out = torch.empty(bands * 128, blocks, dtype=torch.uint8)
    for r in range(bands * 128):
        for j in range(blocks):
            atom = (r // 128) * groups + j // 4
            out[r, j] = flat[atom * 512 + (r % 32) * 16 + (r % 128) // 32 * 4 + j % 4]
    return out


# -- the contiguous layout's scale_a ---------------------------------------------------------------


def test_grouped_bands_bound_every_split_of_the_rows():
    for total, groups in ((1, 1), (128, 1), (129, 2), (300, 3), (1000, 8)):
        bound = bs.grouped_bands(total, groups)
        assert bound == math.ceil(total / 128) + groups - 1
        # the worst split: every group but one with one row past a band
        sizes = [129] * (groups - 1) if total >= 129 * (groups - 1) else [1] * (groups - 1)
        sizes.append(total - sum(sizes))
        assert sum(math.ceil(s / 128) for s in sizes) <= bound


def test_row_ends_are_clamped_as_the_kernel_clamps_them():
    assert bs.group_row_ends([3, 1, 250, 400], 300) == [3, 3, 250, 300]
    assert bs.group_row_ends(torch.tensor([-5, 10], dtype=torch.int32), 8) == [0, 8]


def test_each_group_starts_a_band_of_its_own():
    # groups of 3, 0 and 197 rows: bands 0, (none), 1-2; the tensor holds ceil(200 / 128) + 2 = 4 bands
    rows, blocks = 200, 6
    scales = torch.arange(1, rows * blocks + 1, dtype=torch.int64).remainder(251).add(1).to(torch.uint8)
    scales = scales.reshape(rows, blocks)
    blocked = bs.to_blocked_grouped(scales, [3, 3, 200])
    assert tuple(blocked.shape) == (4, 2, 32, 4, 4) and blocked.is_contiguous()
    raw = _raw(blocked, 4, 8)
    assert torch.equal(raw[0:3, :6], scales[0:3])
    assert torch.equal(raw[128:128 + 197, :6], scales[3:200])
    # padding rows and blocks stay zero
    assert not raw[3:128].any() and not raw[128 + 197:].any() and not raw[:, 6:].any()


def test_one_group_is_the_plain_blocked_layout():
    scales = torch.randint(0, 255, (300, 8), dtype=torch.uint8)
    assert torch.equal(bs.to_blocked_grouped(scales, [300]), bs.to_blocked(scales))


def test_to_blocked_takes_a_batch_of_operands():
    scales = torch.randint(0, 255, (3, 130, 4), dtype=torch.uint8)
    blocked = bs.to_blocked(scales)
    assert tuple(blocked.shape) == (3, 2, 1, 32, 4, 4)
    for g in range(3):
        assert torch.equal(blocked[g], bs.to_blocked(scales[g]))


# -- the float64 reference -------------------------------------------------------------------------


def test_mxfp8_grouped_reference_against_known_values():
    # K = 32: group 0 (rows 0-1) a = 1 with scale 2**0 times w0 = 1 with scale 2**1: 32 * 2 = 64;
    # group 1 (row 2) a = 2 with scale 2**-1 times w1 = 0.5 with scale 2**3: 32 * 1 * 4 = 128.
    k = 32
    a = torch.ones(3, k).to(torch.float8_e4m3fn)
    a[2] = 2.0
    scale_a = bs.e8m0(torch.tensor([[0], [0], [-1]]))
    w = torch.stack((torch.ones(4, k), torch.full((4, k), 0.5))).to(torch.float8_e4m3fn)
    scale_w = bs.e8m0(torch.tensor([[[1]] * 4, [[3]] * 4]))
    out = bs.reference_grouped_mm(a, scale_a, w, scale_w, [2, 3], "mxfp8")
    assert out.dtype == torch.float64
    assert torch.equal(out, torch.tensor([[64.0] * 4, [64.0] * 4, [128.0] * 4], dtype=torch.float64))


def test_nvfp4_masked_reference_against_known_values():
    # K = 16: element 1.5 (code 3) scaled by 2 times element 1 (code 2) scaled by 0.5: 16 * 1.5 = 24;
    # group 0 has 1 of its 2 rows, group 1 none: the other rows stay zero.
    k = 16
    a = torch.full((2, 2, k), 3, dtype=torch.uint8)
    scale_a = torch.full((2, 2, 1), 2.0).to(torch.float8_e4m3fn)
    w = torch.full((2, 3, k), 2, dtype=torch.uint8)
    scale_w = torch.full((2, 3, 1), 0.5).to(torch.float8_e4m3fn)
    out = bs.reference_grouped_mm(a, scale_a, w, scale_w, [1, 0], "nvfp4", masked=True)
    expected = torch.zeros(2, 2, 3, dtype=torch.float64)
    expected[0, 0] = 24.0
    assert torch.equal(out, expected)


def test_mxfp4_masked_reference_against_known_values():
    # K = 64, two e8m0 blocks of 32 per row: a = 3 (code 5) with scales 2**1, 2**-1 times w = 0.5
    # (code 1) with scale 2**2: 32 * 3 * 2 * 0.5 * 4 + 32 * 3 * 0.5 * 0.5 * 4 = 384 + 96 = 480;
    # group 1's second row is past its count and stays zero.
    k = 64
    a = torch.full((2, 2, k), 5, dtype=torch.uint8)
    scale_a = bs.e8m0(torch.tensor([[1, -1]] * 4).reshape(2, 2, 2))
    w = torch.full((2, 3, k), 1, dtype=torch.uint8)
    scale_w = bs.e8m0(torch.full((2, 3, 2), 2))
    out = bs.reference_grouped_mm(a, scale_a, w, scale_w, [2, 1], "mxfp4", masked=True)
    expected = torch.full((2, 2, 3), 480.0, dtype=torch.float64)
    expected[1, 1] = 0.0
    assert torch.equal(out, expected)


@pytest.mark.parametrize("name", ["mxfp8", "nvfp4", "mxfp4"])
def test_the_grouped_reference_is_each_groups_product_and_near_float64(name):
    torch.manual_seed(0)
    k, n, ends = 128, 48, [5, 5, 70]
    x = torch.randn(70, k)
    w = torch.randn(3, n, k)
    qa, sa = bs.quantize(x, name)
    qw, sw = bs.quantize(w, name)
    out = bs.reference_grouped_mm(qa, sa, qw, sw, ends, name)
    for g, (start, end) in enumerate(zip([0, *ends[:-1]], ends)):
        assert torch.equal(out[start:end], bs.reference_mm(qa[start:end], sa[start:end], qw[g], sw[g], name))
        exact = x[start:end].double() @ w[g].double().t()
        if end > start:
            # fp8 keeps 3 mantissa bits, e2m1 one: a relative error of a few percent of the row norm
            tolerance = (0.08 if name == "mxfp8" else 0.35 if name == "nvfp4" else 0.5) * exact.abs().max()
            assert (out[start:end] - exact).abs().max() <= tolerance


# -- a call's checks -------------------------------------------------------------------------------


def _call(name, masked, total=200, n=256, k=128, groups=3):
    fmt = bs.format_of(name)
    packed = fmt.data.value == "e2m1"
    element = torch.float4_e2m1fn_x2 if packed else torch.float8_e4m3fn
    width = k // 2 if packed else k
    a_shape = (groups, total, width) if masked else (total, width)
    a = torch.zeros(a_shape, dtype=torch.uint8).view(element)
    w = torch.zeros(groups, n, width, dtype=torch.uint8).view(element)
    blocks = k // fmt.scale.block
    dtype = bs.scale_dtype(name)
    sw = bs.to_blocked(torch.zeros(groups, n, blocks, dtype=torch.uint8).view(dtype))
    if masked:
        sa = bs.to_blocked(torch.zeros(groups, total, blocks, dtype=torch.uint8).view(dtype))
    else:
        sa = bs.to_blocked_grouped(torch.zeros(total, blocks, dtype=torch.uint8).view(dtype), [10, 100, total])
    return a, w.transpose(1, 2), sa, sw


@pytest.mark.parametrize("masked", [False, True])
@pytest.mark.parametrize("name", ["mxfp8", "nvfp4", "mxfp4"])
def test_well_formed_grouped_calls_pass(name, masked):
    a, b, sa, sw = _call(name, masked)
    bs.check_grouped_block_operands(a, b, name, masked)
    bs.check_grouped_block_scales(a, b, sa, sw, name, masked)


BAD_SCALES = [
    # contiguous scale_a without the per-group padding (ceil(200 / 128) = 2 bands, not 2 + 3 - 1)
    (False, lambda a, b, sa, sw: (bs.to_blocked(torch.zeros(200, 4, dtype=torch.uint8).view(sa.dtype)), sw),
     ValueError, r"scale_a: shape \[2, 1, 32, 4, 4\], not \[4, 1, 32, 4, 4\]; pass to_blocked_grouped\(s, offs\)"),
    # the weights' scales of one group only
    (False, lambda a, b, sa, sw: (sa, sw[0]), ValueError,
     r"scale_b: shape \[2, 1, 32, 4, 4\], not \[3, 2, 1, 32, 4, 4\]; pass to_blocked\(s\) of the weights' "
     r"row-major \(3, 256, 4\) e8m0 scales"),
    (False, lambda a, b, sa, sw: (sa.view(torch.uint8), sw), ValueError,
     r"scale_a: dtype torch.uint8, not torch.float8_e8m0fnu"),
    (False, lambda a, b, sa, sw: (sa, sw.transpose(-1, -2)), ValueError, r"scale_b: strides .*not contiguous"),
    (False, lambda a, b, sa, sw: (None, sw), TypeError, r"scale_a: expected a torch.float8_e8m0fnu CUDA tensor"),
    # masked: one blocked (M_max, K / 32) operand per group
    (True, lambda a, b, sa, sw: (sa[0], sw), ValueError,
     r"scale_a: shape \[2, 1, 32, 4, 4\], not \[3, 2, 1, 32, 4, 4\]; pass to_blocked\(s\) of a's row-major "
     r"\(3, 200, 4\) e8m0 scales"),
]


MXFP4_BAD_SCALES = [
    # nvfp4's scales (e4m3, one per 16) for an mxfp4 call: the weights' (checked first) dtype and shape
    (True, lambda: _call("nvfp4", True)[2:], ValueError,
     r"scale_b: dtype torch.float8_e4m3fn, not torch.float8_e8m0fnu; shape \[3, 2, 2, 32, 4, 4\], not "
     r"\[3, 2, 1, 32, 4, 4\]"),
    # e8m0 scales one per 16 elements (twice mxfp4's): the blocked shape has twice the atoms along K
    (False, lambda: (_call("mxfp4", False)[2], bs.to_blocked(torch.zeros(3, 256, 8, dtype=torch.uint8).view(
        torch.float8_e8m0fnu))), ValueError, r"scale_b: shape \[3, 2, 2, 32, 4, 4\], not \[3, 2, 1, 32, 4, 4\]"),
]


@pytest.mark.parametrize("masked, scales, error, match", MXFP4_BAD_SCALES)
def test_malformed_mxfp4_grouped_scales_are_refused_naming_the_argument(masked, scales, error, match):
    a, b, _, _ = _call("mxfp4", masked)
    sa, sw = scales()
    with pytest.raises(error, match=match):
        bs.check_grouped_block_scales(a, b, sa, sw, "mxfp4", masked)


@pytest.mark.parametrize("masked, change, error, match", BAD_SCALES)
def test_malformed_grouped_scales_are_refused_naming_the_argument(masked, change, error, match):
    a, b, sa, sw = _call("mxfp8", masked)
    sa, sw = change(a, b, sa, sw)
    with pytest.raises(error, match=match):
        bs.check_grouped_block_scales(a, b, sa, sw, "mxfp8", masked)


BAD_OPERANDS = [
    ("mxfp8", lambda a, b: (a.view(torch.uint8), b), TypeError, r"a: mxfp8 takes torch.float8_e4m3fn elements"),
    ("mxfp8", lambda a, b: (a[:, :96], b[:, :96]), ValueError, r"a: K = 96 is not a multiple of 128"),
    ("nvfp4", lambda a, b: (a[:, :16], b[:, :16]), ValueError, r"a: K = 32 is not a multiple of 64"),
    # mxfp4: four e8m0 blocks of 32 per scale-factor atom column, so K = 64 (nvfp4's step) is refused
    ("mxfp4", lambda a, b: (a[:, :32], b[:, :32]), ValueError, r"a: K = 64 is not a multiple of 128"),
    ("mxfp4", lambda a, b: (a.view(torch.uint8), b), TypeError, r"a: mxfp4 takes torch.float4_e2m1fn_x2 elements"),
    ("mxfp8", lambda a, b: (a, b.contiguous()), ValueError,
     r"b: mxfp8 grouped calls take b K-major, a \(G, N, K\) weight's .transpose\(1, 2\)"),
    ("mxfp8", lambda a, b: (a, b[0]), ValueError, r"b: a mxfp8 grouped call takes b \(G, K, N\)"),
    ("mxfp8", lambda a, b: (a[None], b), ValueError, r"a: a mxfp8 grouped call takes a \(total_M, K\)"),
]


@pytest.mark.parametrize("name, change, error, match", BAD_OPERANDS)
def test_malformed_grouped_operands_are_refused_naming_the_argument(name, change, error, match):
    a, b, _, _ = _call(name, False)
    a, b = change(a, b)
    with pytest.raises(error, match=match):
        bs.check_grouped_block_operands(a, b, name, False)


def test_a_grouped_scale_format_is_none_or_block_scaled():
    assert bs.grouped_block_format(None) is None and bs.grouped_block_format("nvfp4") == "nvfp4"
    with pytest.raises(ValueError, match=r"scale_format: grouped calls read per-tensor or row-wise scales from their "
                                         r"shapes \(pass None\), or take 'blockwise' or a block-scaled format "
                                         r"\('mxfp8'"):
        bs.grouped_block_format("columnwise")


# -- kernel choice and the arch message ------------------------------------------------------------


def _grouped_record(index, kernel_id, family, **config):
    import dataclasses

    from tests.records import kernel_record

    record = kernel_record(index, kernel_id, (128, 256, 128), dtypes=("e4m3", "e4m3", "f32", "bf16"), div=16)
    return dataclasses.replace(record, config=dataclasses.replace(record.config, pipeline="sm100", family=family,
                                                                  **config))


def test_a_block_scaled_grouped_call_runs_only_on_a_block_scaled_grouped_kernel():
    from tilekiln._tensors import Operand
    from tilekiln.grouped import make_grouped_problem
    from tilekiln.problem import requested_epilogue
    from tilekiln.select import check_kernel
    from tilekiln.spec import BlockScale, DType

    mx = _grouped_record(0, "mx", "grouped", block_scale=BlockScale(DType("e8m0"), 32))
    per_tensor = _grouped_record(1, "fp8", "grouped")
    a = Operand("a", (300, 512), (512, 1), "e4m3", 1 << 20, 0, None)
    b = Operand("b", (4, 512, 384), (512 * 384, 1, 512), "e4m3", 1 << 21, 0, None)
    offs = Operand("offs", (4,), (1,), "i32", 1 << 22, 0, None)
    asked = make_grouped_problem(a, b, offs, None, True, requested_epilogue(**dict(bs.block_request("mxfp8"))))
    assert (asked.out_dtype, asked.k, asked.groups) == ("bf16", 512, 4)
    assert check_kernel(mx, asked) is None
    assert check_kernel(per_tensor, asked) == "block_scale: kernel computes None, the call asks for sfe8m0x32"
    assert check_kernel(mx, make_grouped_problem(a, b, offs, None, True)) == (
        "block_scale: kernel computes sfe8m0x32, the call asks for None")


def test_an_nvfp4_grouped_problem_counts_k_in_elements():
    from tilekiln._tensors import describe
    from tilekiln.grouped import make_masked_problem
    from tilekiln.problem import requested_epilogue

    import dataclasses

    a, b, _, _ = _call("nvfp4", True, total=64, n=128, k=256, groups=2)
    rows = torch.zeros(2, dtype=torch.int32)
    # described as the CUDA tensors of a call (device 0); the packed bytes count two elements each
    a_op, b_op, rows_op = (dataclasses.replace(describe(t, name), device=0)
                           for t, name in ((a, "a"), (b, "b"), (rows, "masked_m")))
    assert a_op.shape == (2, 64, 256) and b_op.shape == (2, 256, 128)
    problem = make_masked_problem(a_op, b_op, rows_op, None, True,
                                  requested_epilogue(**dict(bs.block_request("nvfp4"))))
    assert (problem.m, problem.n, problem.k, problem.groups, problem.out_shape) == (64, 128, 256, 2, (2, 64, 128))


@pytest.mark.parametrize("masked", [False, True])
def test_a_bundle_without_block_scaled_kernels_refuses_a_grouped_call_with_the_arch_message(tmp_path, masked):
    from tests.records import manifest
    from tilekiln._torch.run_grouped import grouped_plan
    from tilekiln.bundle import Bundle, DeviceInfo
    from tilekiln.errors import NoKernelError

    hopper = Bundle(tmp_path, manifest((_grouped_record(0, "fp8", "grouped"),)),
                    device_query=lambda ordinal: DeviceInfo(ordinal, (9, 0), 132, "NVIDIA H200", 143156))
    a, b, sa, sw = _call("mxfp8", masked)
    rows = torch.tensor([10, 100, 200], dtype=torch.int32)
    with pytest.raises(NoKernelError, match=r"scale_format='mxfp8': bundle sm90a \(sm_90a\) has no mxfp8 kernels; "
                                            r"the block-scaled tcgen05 MMA exists on compute capability 10\.x"):
        grouped_plan(hopper, a, b, rows, sa, sw, None, None, masked, "none", "mxfp8")


def _bundle_of(tmp_path, *kernels):
    """A bundle of ``kernels`` (tests/records.py's manifest, whose device it matches): kernel choice
    only reads the records."""
    from tests.records import manifest
    from tilekiln.bundle import Bundle, DeviceInfo

    return Bundle(tmp_path, manifest(kernels), device_query=lambda ordinal: DeviceInfo(ordinal, (9, 0), 132, "NVIDIA H200", 143156))


def test_explain_names_the_block_scaled_grouped_kernel_of_a_scale_format(tmp_path):
    from torch._subclasses.fake_tensor import FakeTensorMode

    import tilekiln
    from tilekiln.spec import BlockScale, DType

    mx = _grouped_record(0, "mx", "grouped", block_scale=BlockScale(DType("e8m0"), 32))
    per_tensor = _grouped_record(1, "fp8", "grouped")
    bundle = _bundle_of(tmp_path, mx, per_tensor)
    with FakeTensorMode():
        a = torch.empty(300, 512, dtype=torch.float8_e4m3fn, device="cuda")
        w = torch.empty(4, 384, 512, dtype=torch.float8_e4m3fn, device="cuda")
        offs = torch.empty(4, dtype=torch.int32, device="cuda")
        assert tilekiln.explain(a, w.transpose(1, 2), offs=offs, scale_format="mxfp8", bundle=bundle).kernel.id == "mx"
        assert tilekiln.explain(a, w.transpose(1, 2), offs=offs, bundle=bundle).kernel.id == "fp8"


def test_a_block_scaled_grouped_call_traces_as_one_node_with_its_scale_format(tmp_path):
    from torch._subclasses.fake_tensor import FakeTensorMode

    import tilekiln
    from tests.unit.test_torch_ops import traced

    from tilekiln.spec import BlockScale, DType

    bundle = _bundle_of(tmp_path, _grouped_record(0, "mx", "grouped", block_scale=BlockScale(DType("e8m0"), 32)))
    with FakeTensorMode():
        a = torch.empty(300, 128, dtype=torch.float8_e4m3fn, device="cuda")
        w = torch.empty(3, 256, 128, dtype=torch.float8_e4m3fn, device="cuda")
        offs = torch.empty(3, dtype=torch.int32, device="cuda")
        sa = torch.empty(bs.grouped_bands(300, 3), 1, 32, 4, 4, dtype=torch.float8_e8m0fnu, device="cuda")
        sb = torch.empty(3, 2, 1, 32, 4, 4, dtype=torch.float8_e8m0fnu, device="cuda")
        got, ops = traced(lambda: tilekiln.grouped_gemm(a, w.transpose(1, 2), offs, scale_a=sa, scale_b=sb,
                                                         scale_format="mxfp8", bundle=bundle))
    assert ops == ["tilekiln.grouped_gemm.default"]
    assert got.shape == (300, 256) and got.dtype == torch.bfloat16


def _fp4_record(index, kernel_id, family, pipeline, tile, scale="e8m0", block=32):
    """An e2m1 block-scaled grouped kernel's record: mxfp4 (e8m0 per 32) unless told."""
    import dataclasses

    from tests.records import kernel_record
    from tilekiln.spec import BlockScale, DType

    record = kernel_record(index, kernel_id, tile, dtypes=("e2m1", "e2m1", "f32", "bf16"), div=32)
    return dataclasses.replace(record, config=dataclasses.replace(
        record.config, pipeline=pipeline, family=family, block_scale=BlockScale(DType(scale), block)))


def _fp4_operands(masked, total=300, n=384, k=512, groups=4):
    """Fake CUDA tensors of an e2m1 grouped call: a, b (a (G, N, K) weight's transpose) and the row
    vector (packed e2m1: K / 2 bytes per row)."""
    a_shape = (groups, total, k // 2) if masked else (total, k // 2)
    a = torch.empty(a_shape, dtype=torch.float4_e2m1fn_x2, device="cuda")
    w = torch.empty(groups, n, k // 2, dtype=torch.float4_e2m1fn_x2, device="cuda")
    return a, w.transpose(1, 2), torch.empty(groups, dtype=torch.int32, device="cuda")


def test_an_mxfp4_grouped_call_runs_on_the_mxfp4_kernel_of_its_layout(tmp_path):
    """grouped_gemm and grouped_gemm_masked with scale_format="mxfp4" (explain names what they run): the
    mxfp4 kernel of the call's layout, never mxfp8's (the same e8m0 scale per 32, other elements) or
    nvfp4's (the same elements, other scales), and none where the bundle has no masked nvfp4 kernel."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    import tilekiln
    from tilekiln.spec import BlockScale, DType

    bundle = _bundle_of(
        tmp_path,
        _grouped_record(0, "mxfp8_masked", "grouped_masked", block_scale=BlockScale(DType("e8m0"), 32)),
        _fp4_record(1, "mxfp4", "grouped", "sm100", (128, 256, 256)),
        _fp4_record(2, "mxfp4_masked", "grouped_masked", "sm100", (128, 128, 256)),
        _fp4_record(3, "nvfp4", "grouped", "sm100", (128, 256, 256), "e4m3", 16))
    with FakeTensorMode():
        a, b, offs = _fp4_operands(False)
        assert tilekiln.explain(a, b, offs=offs, scale_format="mxfp4", bundle=bundle).kernel.id == "mxfp4"
        assert tilekiln.explain(a, b, offs=offs, scale_format="nvfp4", bundle=bundle).kernel.id == "nvfp4"
        a, b, masked_m = _fp4_operands(True)
        assert tilekiln.explain(a, b, masked_m=masked_m, scale_format="mxfp4", bundle=bundle).kernel.id == (
            "mxfp4_masked")
        refused = tilekiln.explain(a, b, masked_m=masked_m, scale_format="nvfp4", bundle=bundle)
        assert refused.kernel is None
        reasons = {c.kernel.id: c.reason for c in refused.candidates}
        assert reasons["nvfp4"] == "family: kernel computes grouped, the call is grouped_masked"
        assert reasons["mxfp4_masked"] == "block_scale: kernel computes sfe8m0x32, the call asks for sfe4m3x16"


def test_an_mxfp4_masked_call_traces_as_one_node_with_its_scale_format(tmp_path):
    from torch._subclasses.fake_tensor import FakeTensorMode

    import tilekiln
    from tests.unit.test_torch_ops import traced

    bundle = _bundle_of(tmp_path, _fp4_record(0, "mxfp4_masked", "grouped_masked", "sm107", (128, 128, 256)))
    with FakeTensorMode():
        a, b, masked_m = _fp4_operands(True, total=64, n=256, k=256, groups=3)
        sa = torch.empty(3, 1, 1, 32, 4, 4, dtype=torch.float8_e8m0fnu, device="cuda")
        sb = torch.empty(3, 2, 1, 32, 4, 4, dtype=torch.float8_e8m0fnu, device="cuda")
        got, ops = traced(lambda: tilekiln.grouped_gemm_masked(a, b, masked_m, scale_a=sa, scale_b=sb,
                                                                scale_format="mxfp4", bundle=bundle))
    assert ops == ["tilekiln.grouped_gemm_masked.default"]
    assert got.shape == (3, 64, 256) and got.dtype == torch.bfloat16


def test_the_sm103_48_byte_k_grouped_kernel_takes_any_k_of_whole_scale_atoms(tmp_path):
    """An sm103a bundle holds nvfp4 grouped kernels of both pipelines: the sm100 one's 256-element K
    slice and the sm103 one's 768 (384 bytes, cta_k_bytes_fixed). Neither needs K to be a multiple of
    its slice (TMA zero-fills past K), so both are candidates for K = 832 (13 atoms of 64)."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    import tilekiln

    bundle = _bundle_of(tmp_path, _fp4_record(0, "k32", "grouped", "sm100", (128, 256, 256), "e4m3", 16),
                        _fp4_record(1, "k48", "grouped", "sm103", (128, 128, 768), "e4m3", 16))
    with FakeTensorMode():
        a, b, offs = _fp4_operands(False, k=832)
        choice = tilekiln.explain(a, b, offs=offs, scale_format="nvfp4", bundle=bundle)
    assert {c.kernel.id: c.accepted for c in choice.candidates} == {"k32": True, "k48": True}


def test_a_masked_nvfp4_call_plans_on_the_masked_nvfp4_kernel(tmp_path):
    """Decode-time expert batches in nvfp4 (e4m3 scale per 16) run on the masked nvfp4 kernel, not
    on the masked mxfp4 one beside it."""
    import dataclasses

    from tilekiln._tensors import describe
    from tilekiln.grouped import choose_grouped, make_masked_problem
    from tilekiln.problem import requested_epilogue

    bundle = _bundle_of(tmp_path, _fp4_record(0, "mxfp4_masked", "grouped_masked", "sm100", (128, 128, 256)),
                        _fp4_record(1, "nvfp4_masked", "grouped_masked", "sm100", (128, 128, 256), "e4m3", 16))
    a, b, _, _ = _call("nvfp4", True)
    rows = torch.zeros(3, dtype=torch.int32)
    a_op, b_op, rows_op = (dataclasses.replace(describe(t, name), device=0)
                           for t, name in ((a, "a"), (b, "b"), (rows, "masked_m")))
    problem = make_masked_problem(a_op, b_op, rows_op, None, True, requested_epilogue(**dict(bs.block_request("nvfp4"))))
    assert choose_grouped(bundle, problem).label == "nvfp4_masked"


def test_a_masked_nvfp4_call_without_a_masked_nvfp4_kernel_names_each_refusal(tmp_path):
    """The bundle has nvfp4 kernels (no arch message) but none of the masked layout: NoKernelError
    with each kernel's reason, before anything is launched."""
    import dataclasses

    from tilekiln._tensors import describe
    from tilekiln.errors import NoKernelError
    from tilekiln.grouped import make_masked_problem, plan_grouped
    from tilekiln.problem import requested_epilogue

    bundle = _bundle_of(tmp_path, _fp4_record(0, "nvfp4", "grouped", "sm100", (128, 256, 256), "e4m3", 16),
                        _fp4_record(1, "mxfp4_masked", "grouped_masked", "sm100", (128, 128, 256)))
    a, b, _, _ = _call("nvfp4", True)
    rows = torch.zeros(3, dtype=torch.int32)
    # described as the CUDA tensors of a call (device 0)
    a_op, b_op, rows_op = (dataclasses.replace(describe(t, name), device=0)
                           for t, name in ((a, "a"), (b, "b"), (rows, "masked_m")))
    problem = make_masked_problem(a_op, b_op, rows_op, None, True, requested_epilogue(**dict(bs.block_request("nvfp4"))))
    with pytest.raises(NoKernelError, match=r"has no grouped_masked kernel for e2m1/e2m1->bf16 .*\n.*\n"
                                            r"  reject mxfp4_masked: block_scale: kernel computes sfe8m0x32, the call "
                                            r"asks for sfe4m3x16\n"
                                            r"  reject nvfp4: family: kernel computes grouped, the call is grouped_masked"):
        plan_grouped(bundle, problem)
