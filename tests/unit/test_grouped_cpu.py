"""The grouped family without a GPU: its spec and launch blocks, the argument checks of
tilekiln.grouped_gemm, selection among grouped kernels, the operators' fakes and the template's
rendering and shared-memory model."""

from __future__ import annotations

import math

from dataclasses import replace
from pathlib import Path

import pytest

from tilekiln.grouped import MAX_GROUPS, make_grouped_problem
from tilekiln.problem import make_problem
from tilekiln.select import check_kernel, choose
from tilekiln.spec import FAMILIES, format_kernel_id, parse_kernel_id
from tests.records import kernel_record, op, pick

ROOT = Path(__file__).resolve().parents[2]


def weights(groups, n, k, dtype="bf16"):
    """nn.Linear-style (G, N, K) weights as the call passes them: .transpose(1, 2), K-major (G, K, N)."""
    return op("b", (groups, k, n), (n * k, 1, k), dtype)


def grouped(index, tile, cluster=(1, 1), dtype="bf16", schedule="cooperative"):
    from tilekiln.spec import Schedule

    record = kernel_record(index, f"g{index}_{tile[0]}x{tile[1]}", tile, cluster, dtypes=(dtype, dtype, "f32", "bf16"))
    config = replace(record.config, family="grouped", schedule=Schedule(schedule))
    return replace(record, config=config, id=format_kernel_id(config))


GROUPED = (grouped(0, (128, 256, 64)), grouped(1, (128, 128, 64)), grouped(2, (64, 128, 64), schedule="pingpong"),
           grouped(3, (128, 128, 128), dtype="e4m3"))


def test_the_family_passes_offs_between_the_tensors_and_the_scales():
    family = FAMILIES["grouped"]
    assert family.arguments == ("a", "b", "c", "offs", "scale_a", "scale_b", "resident_clusters", "stream")
    assert family.extents == ("m", "n", "k", "g")
    assert family.call_format == "<" + "Q" * 7
    # Three tensors' and two scales' (lead, batch) strides (the scales' zero: per-tensor), four
    # extents, clusters, device, index and padding.
    assert family.plan_format == "<" + "q" * 10 + "i" * 8
    assert family.indices[0].limit == MAX_GROUPS
    # The dense family has no index vectors; its call block: a, b, c, the scales, the bias, the
    # residual, scale_result, alpha and beta, the stream.
    assert FAMILIES["gemm"].indices == () and FAMILIES["gemm"].call_format == "<" + "Q" * 8 + "ff" + "Q"
    assert family.vectors == () and family.likes == () and family.scalars == () and family.values == ()


def test_kernel_ids_name_the_family():
    kernel_id = "grouped_sm90_bf16_bf16_f32_bf16_tn_64x128x64_c1x1_pingpong"
    config = parse_kernel_id(kernel_id)
    assert config.family == "grouped" and format_kernel_id(config) == kernel_id


def test_glue_exports_a_grouped_launcher_with_offs_in_the_call_block():
    from builder.package.link import LinkInput, render_glue
    from builder.compile.objfile import EntryPoints

    entry = EntryPoints("p", "p_init", "p_load", "p_launch")
    text = render_glue("sm90a", [LinkInput("gemm_x", "gemm", b"", entry),
                                 LinkInput("grouped_x", "grouped", b"", entry)])
    assert "TK_EXPORT int tk_run_grouped(const tk_plan_grouped_t *plan, const tk_call_grouped_t *call)" in text
    call = text.split("} tk_call_grouped_t;")[0].rsplit("typedef struct {", 1)[1]
    assert call.split() == ["void", "*a,", "*b,", "*c;", "void", "*offs;", "/*", "int32", "vectors,", "one", "entry",
                            "per", "index", "of", "an", "extent", "*/", "void", "*scale_a,", "*scale_b;", "/*",
                            "float32", "scales,", "read", "only", "by", "kernels", "that", "scale:", "one", "element,",
                            "or", "per", "block", "*/", "void", "*stream;"]
    launch = " ".join(text.split("tk_run_grouped(const", 1)[1].split("void *args[9] = {", 1)[1].split("};")[0].split())
    assert launch == ("&a, &b, &c, &offs, scaling == TK_SCALING_BLOCKWISE ? (void *)&scale_a_blocks : "
                      "scaling == TK_SCALING_ROWWISE ? (void *)&scale_a_rows : (void *)&scale_a, "
                      "scaling == TK_SCALING_BLOCKWISE ? (void *)&scale_b_blocks : "
                      "scaling == TK_SCALING_ROWWISE ? (void *)&scale_b_rows : (void *)&scale_b, "
                      "&clusters, &stream, &result")
    dense = text.split("} tk_call_gemm_t;")[0].rsplit("typedef struct {", 1)[1]
    assert "offs" not in dense


def test_a_problem_of_nn_linear_weights_is_tn_with_padded_result_rows():
    p = make_grouped_problem(op("a", (300, 512)), weights(8, 1000, 512), op("offs", (8,), dtype="i32"), None, False)
    assert (p.family, p.m, p.n, p.k, p.groups, p.batch) == ("grouped", 300, 1000, 512, 8, 1)
    assert (p.a.major, p.b.major, p.b.lead, p.b.batch) == ("k", "k", 512, 512000)
    assert p.c.lead == 1000 and p.out_dtype == "bf16"
    assert p.extent("g") == 8 and p.extent("m") == 300


def test_n_major_weights_and_fp8_with_scales():
    p = make_grouped_problem(op("a", (64, 256), dtype="e4m3"), op("b", (4, 256, 128), dtype="e4m3"),
                             op("offs", (4,), dtype="i32"), None, True)
    assert p.b.major == "n" and p.out_dtype == "bf16" and p.dtype == "e4m3/e4m3->bf16"


def test_no_rows_or_no_k_is_a_problem_without_a_launch():
    for m, k in ((0, 64), (10, 0)):
        p = make_grouped_problem(op("a", (m, k)), weights(2, 64, k), op("offs", (2,), dtype="i32"), None, False)
        assert 0 in (p.m, p.k) and p.out_shape == (m, 64)


BAD = [
    (op("a", (4, 8, 16)), weights(2, 32, 16), op("offs", (2,), dtype="i32"), None, False, ValueError,
     "a: expected a 2-D"),
    (op("a", (8, 16)), op("b", (32, 16)), op("offs", (2,), dtype="i32"), None, False, ValueError, "b: expected a 3-D"),
    (op("a", (8, 16)), weights(2, 32, 24), op("offs", (2,), dtype="i32"), None, False, ValueError, "b's K 24"),
    (op("a", (8, 16)), weights(2, 32, 16), op("offs", (3,), dtype="i32"), None, False, ValueError,
     "offs: expected a 1-D tensor of G = 2"),
    (op("a", (8, 16)), weights(2, 32, 16), op("offs", (2,), dtype="i64"), None, False, TypeError,
     "offs: expected int32"),
    (op("a", (8, 16)), weights(2, 32, 16), op("offs", (2,), (2,), dtype="i32"), None, False, ValueError,
     "offs: must be contiguous"),
    (op("a", (8, 16)), weights(MAX_GROUPS + 1, 32, 16), op("offs", (MAX_GROUPS + 1,), dtype="i32"), None, False,
     ValueError, f"b: {MAX_GROUPS + 1} groups"),
    (op("a", (8, 16)), weights(0, 32, 16), op("offs", (0,), dtype="i32"), None, False, ValueError, "b: 0 groups"),
    (op("a", (8, 16)), weights(2, 32, 16, "f16"), op("offs", (2,), dtype="i32"), None, False, TypeError,
     "b: dtype f16 differs"),
    (op("a", (8, 16)), weights(2, 32, 16), op("offs", (2,), dtype="i32"), None, True, TypeError,
     "scale_a: scales are for 8-bit"),
    (op("a", (8, 16), dtype="e4m3"), weights(2, 32, 16, "e4m3"), op("offs", (2,), dtype="i32"), None, False,
     TypeError, "need scales: pass scale_a and scale_b"),
    (op("a", (8, 16), device=-1), weights(2, 32, 16), op("offs", (2,), dtype="i32"), None, False, ValueError,
     "a: tensor is in host memory"),
    (op("a", (8, 16)), weights(2, 32, 16), op("offs", (2,), dtype="i32", device=-1), None, False, ValueError,
     "offs: tensor is in host memory"),
    (op("a", (8, 16)), weights(2, 32, 16), op("offs", (2,), dtype="i32", device=1), None, False, ValueError,
     "offs: is on cuda:1"),
    (op("a", (8, 16)), weights(2, 32, 16), op("offs", (2,), dtype="i32"), op("out", (8, 31)), False, ValueError,
     "out: shape [8, 31]"),
    (op("a", (8, 16)), weights(2, 32, 16), op("offs", (2,), dtype="i32"), op("out", (8, 32), dtype="f32"), False,
     TypeError, "out: dtype f32"),
    (op("a", (8, 16)), weights(2, 32, 16), op("offs", (2,), dtype="i32"), op("out", (8, 32), (1, 8)), False,
     ValueError, "out: strides [1, 8]"),
    (op("a", (8, 16), (1, 8)), weights(2, 32, 16), op("offs", (2,), dtype="i32"), None, False, ValueError,
     "a: strides [1, 8]"),
    (op("a", (8, 16)), op("b", (2, 16, 32), (1024, 2, 64)), op("offs", (2,), dtype="i32"), None, False, ValueError,
     "b: strides [1024, 2, 64]"),
]


@pytest.mark.parametrize("a, b, offs, out, scaled, exc, text", BAD)
def test_argument_errors_name_the_argument(a, b, offs, out, scaled, exc, text):
    with pytest.raises(exc, match=None) as info:
        make_grouped_problem(a, b, offs, out, scaled)
    assert text in str(info.value)


def problem(m, groups, n=4096, k=2048, dtype="bf16"):
    return make_grouped_problem(op("a", (m, k), dtype=dtype), weights(groups, n, k, dtype),
                                op("offs", (groups,), dtype="i32"), None, dtype == "e4m3")


def test_grouped_and_dense_kernels_never_run_each_others_problems():
    dense = kernel_record(9, "dense", (128, 128, 64))
    assert check_kernel(dense, problem(1024, 8)) == "family: kernel computes gemm, the call is grouped"
    dense_problem = make_problem(op("a", (64, 64)), op("b", (64, 64), (1, 64)), None)
    assert check_kernel(GROUPED[1], dense_problem) == "family: kernel computes grouped, the call is gemm"
    assert check_kernel(GROUPED[3], problem(1024, 8)).startswith("dtype:")
    assert check_kernel(GROUPED[3], problem(1024, 8, dtype="e4m3")) is None


def test_small_groups_choose_64_row_tiles_and_large_ones_128_rows():
    # 128 experts of 32 rows on average: 128-row tiles would compute mostly rows that are never stored.
    assert choose(GROUPED, problem(128 * 32, 128, n=1536), 132, pick()).kernel.config.tile.m == 64
    assert choose(GROUPED, problem(8 * 4096, 8, n=28672, k=4096), 132, pick()).kernel.config.tile.m == 128


def test_row_tiles_expect_half_a_tile_of_padding_per_large_group_and_one_tile_per_small_one():
    # Exponentially distributed rows: 1 / (1 - exp(-tile / mean)) tiles per group.
    assert problem(128 * 4096, 128).row_tiles(128) == round(128 / -math.expm1(-128 / 4096))
    assert 128 * (4096 / 128 + 0.5) - 1 <= problem(128 * 4096, 128).row_tiles(128) <= 128 * (4096 / 128 + 0.5) + 1
    assert problem(8 * 8, 8).row_tiles(128) == 8
    assert problem(0, 8).row_tiles(128) == 0


def test_the_cluster_along_m_wins_for_large_groups_only():
    # Qwen3-30B-A3B at 4096 tokens (256 rows per expert) stays on 1x1; DeepSeek-V3's 32 local
    # experts at 1024 rows each take the 2x1 cluster (H100, bench/results/h100-2026-12-07-grouped-variants.json).
    kernels = (grouped(0, (128, 256, 64)), grouped(1, (128, 256, 64), cluster=(2, 1)))
    assert choose(kernels, problem(128 * 256, 128, n=1536), 132, pick()).kernel.config.cluster.m == 1
    assert choose(kernels, problem(32 * 1024, 32, n=4096, k=7168), 132, pick()).kernel.config.cluster.m == 2


def test_work_items_past_int32_are_refused():
    p = problem(2**31 - 1, 256, n=2**20)
    assert check_kernel(GROUPED[2], p).startswith("extent: up to")


def test_every_operator_traces_as_one_node(tmp_path):
    import torch
    from torch._subclasses.fake_tensor import FakeTensorMode

    import tilekiln
    from tilekiln.bundle import Bundle, DeviceInfo
    from tests.records import manifest
    from tests.unit.test_torch_ops import traced

    bundle = Bundle(tmp_path, manifest(), device_query=lambda ordinal: DeviceInfo(ordinal, (9, 0), 132, "NVIDIA H200", 143156))
    with FakeTensorMode():
        a = torch.empty(300, 256, dtype=torch.bfloat16, device="cuda")
        w = torch.empty(8, 1004, 256, dtype=torch.bfloat16, device="cuda")
        a8, w8 = a.to(torch.float8_e4m3fn), w.to(torch.float8_e4m3fn)
        offs = torch.empty(8, dtype=torch.int32, device="cuda")
        one = torch.empty(1, dtype=torch.float32, device="cuda")
        out = torch.empty(300, 1004, dtype=torch.bfloat16, device="cuda")
        got, ops = traced(lambda: tilekiln.grouped_gemm(a, w.transpose(1, 2), offs, bundle=bundle))
        assert ops == ["tilekiln.grouped_gemm.default"]
        # Rows of 1004 bf16 are 2008 bytes, not a multiple of 16: the result is a padded view.
        assert got.shape == (300, 1004) and got.stride() == (1008, 1) and got.dtype == torch.bfloat16
        got, ops = traced(lambda: bundle.grouped_gemm(a8, w8.transpose(1, 2), offs, scale_a=one, scale_b=one))
        assert ops == ["tilekiln.grouped_gemm.default"] and got.dtype == torch.bfloat16
        _, ops = traced(lambda: tilekiln.grouped_gemm(a, w.transpose(1, 2), offs, out=out, bundle=bundle))
        assert ops == ["tilekiln.grouped_gemm_out.default"]


def test_calls_that_cannot_run_raise_before_anything_is_launched(tmp_path):
    import torch

    import tilekiln
    from tilekiln.bundle import Bundle, DeviceInfo
    from tests.records import manifest

    bundle = Bundle(tmp_path, manifest(), device_query=lambda ordinal: DeviceInfo(ordinal, (9, 0), 132, "NVIDIA H200", 143156))
    a, w = torch.zeros(10, 64, dtype=torch.bfloat16), torch.zeros(2, 32, 64, dtype=torch.bfloat16)
    with pytest.raises(TypeError, match="offs: expected an int32 torch tensor"):
        bundle.grouped_gemm(a, w.transpose(1, 2), [5, 10])
    with pytest.raises(ValueError, match="a: tensor is in host memory"):
        bundle.grouped_gemm(a, w.transpose(1, 2), torch.tensor([5, 10], dtype=torch.int32))
    with pytest.raises(TypeError, match="grouped_gemm takes torch tensors"):
        tilekiln.grouped_gemm([[1.0]], w, torch.tensor([1], dtype=torch.int32))
    with pytest.raises(RuntimeError, match="not differentiable"):
        tilekiln.grouped_gemm(a.requires_grad_(), w.transpose(1, 2), torch.tensor([5, 10], dtype=torch.int32),
                              bundle=bundle)


def test_template_renders_a_grouped_kernel_whose_table_the_smem_model_counts():
    from builder.check.validate import Project, validate_project
    from builder.render import render_kernel

    result = validate_project(Project(ROOT))
    ctxs = [c for c in result.kernels if c.entry.config.family in ("grouped", "grouped_masked")]
    assert {c.entry.kernel_id for c in ctxs} >= {"grouped_sm90_bf16_bf16_f32_bf16_tn_128x128x64_c1x1",
                                                  "grouped_sm90_bf16_bf16_f32_bf16_tn_64x128x64_c1x1_pingpong",
                                                  "grouped_sm90_e4m3_e4m3_f32_bf16_tn_128x256x128_c1x1",
                                                  "grouped_masked_sm90_bf16_bf16_f32_bf16_tn_64x128x64_c1x1_pingpong",
                                                  "grouped_sm100_bf16_bf16_f32_bf16_tn_128x256x64_c1x1",
                                                  "grouped_masked_sm100_bf16_bf16_f32_bf16_tn_128x128x64_c1x1",
                                                  "grouped_sm107_e4m3_e4m3_f32_bf16_tn_128x256x128_c1x1"}
    for ctx in ctxs:
        # Hopper's warpgroup-MMA template, or the tcgen05 one on the Blackwell-family pipelines (its
        # block-scaled form for block-scaled kernels; sm103's own, the 48-byte-K MMA, on sm103).
        pipeline = ctx.entry.config.pipeline
        tcgen05 = ("sm103_blockscaled_grouped" if pipeline == "sm103" else "sm100_blockscaled_grouped"
                   if ctx.entry.config.block_scale else "sm100_grouped")
        assert ctx.template.name == ("sm90_grouped" if pipeline == "sm90" else tcgen05)
        # Cluster tiles along M (B multicast) only where the template walks them (sm90_grouped).
        assert ctx.entry.config.cluster.m == 1 or ctx.template.name == "sm90_grouped"
        # Row ends and item ends, int32, one more entry than the most groups.
        assert ctx.plan.smem.table_bytes == 2 * (MAX_GROUPS + 1) * 4
        text = render_kernel(ctx).text
        assert "TABLE_ENTRIES = 256 + 1" in text
        masked = ctx.entry.config.family == "grouped_masked"
        assert f"MASKED = {masked}" in text
        signature = ("def __call__(self, a: cute.Tensor, b: cute.Tensor, c: cute.Tensor,\n"
                     f"                 {'masked_m' if masked else 'offs'}: cute.Tensor,\n"
                     "                 scale_a: cute.Tensor, scale_b: cute.Tensor,")
        assert signature in text


# -- the masked layout ---------------------------------------------------------------------------

def test_the_masked_family_passes_masked_m():
    family = FAMILIES["grouped_masked"]
    assert family.arguments == ("a", "b", "c", "masked_m", "scale_a", "scale_b", "resident_clusters", "stream")
    assert family.plan_format == FAMILIES["grouped"].plan_format
    config = parse_kernel_id("grouped_masked_sm90_bf16_bf16_f32_bf16_tn_64x128x64_c1x1_pingpong")
    assert config.family == "grouped_masked"


def test_a_masked_problem_keeps_each_groups_batch_entry():
    from tilekiln.grouped import make_masked_problem

    p = make_masked_problem(op("a", (8, 64, 512)), weights(8, 1000, 512), op("masked_m", (8,), dtype="i32"), None,
                            False)
    assert (p.family, p.m, p.n, p.k, p.groups) == ("grouped_masked", 64, 1000, 512, 8)
    assert (p.a.lead, p.a.batch, p.c.lead, p.c.batch) == (512, 64 * 512, 1000, 64 * 1000)
    assert p.out_shape == (8, 64, 1000) and p.row_tiles(64) == 8


MASKED_BAD = [
    (op("a", (64, 512)), weights(8, 32, 512), op("masked_m", (8,), dtype="i32"), None, ValueError,
     "a: expected a 3-D (G, M_max, K)"),
    (op("a", (4, 64, 512)), weights(8, 32, 512), op("masked_m", (8,), dtype="i32"), None, ValueError,
     "b: has 8 groups but a has 4"),
    (op("a", (8, 64, 512)), weights(8, 32, 512), op("masked_m", (8,), dtype="i64"), None, TypeError,
     "masked_m: expected int32 row counts"),
    (op("a", (8, 64, 512)), weights(8, 32, 512), op("masked_m", (4,), dtype="i32"), None, ValueError,
     "masked_m: expected a 1-D tensor of G = 8 row counts"),
    (op("a", (8, 64, 512)), weights(8, 32, 512), op("masked_m", (8,), dtype="i32"), op("out", (8, 64, 33)),
     ValueError, "out: shape [8, 64, 33] does not match the result shape [8, 64, 32]"),
    (op("a", (8, 64, 512)), weights(8, 32, 512), op("masked_m", (8,), dtype="i32"),
     op("out", (8, 64, 32), (32, 32, 1)), ValueError, "out: batch stride 32 overlaps"),
]


@pytest.mark.parametrize("a, b, rows, out, exc, text", MASKED_BAD)
def test_masked_argument_errors_name_the_argument(a, b, rows, out, exc, text):
    from tilekiln.grouped import make_masked_problem

    with pytest.raises(exc) as info:
        make_masked_problem(a, b, rows, out, False)
    assert text in str(info.value)


def test_masked_and_contiguous_kernels_run_only_their_layout():
    from tilekiln.grouped import make_masked_problem

    masked = make_masked_problem(op("a", (8, 64, 512)), weights(8, 256, 512), op("masked_m", (8,), dtype="i32"),
                                 None, False)
    assert check_kernel(GROUPED[2], masked) == "family: kernel computes grouped, the call is grouped_masked"
    config = replace(GROUPED[2].config, family="grouped_masked")
    assert check_kernel(replace(GROUPED[2], config=config, id=format_kernel_id(config)), masked) is None


def test_masked_operators_trace_as_one_node(tmp_path):
    import torch
    from torch._subclasses.fake_tensor import FakeTensorMode

    import tilekiln
    from tilekiln.bundle import Bundle, DeviceInfo
    from tests.records import manifest
    from tests.unit.test_torch_ops import traced

    bundle = Bundle(tmp_path, manifest(), device_query=lambda ordinal: DeviceInfo(ordinal, (9, 0), 132, "NVIDIA H200", 143156))
    with FakeTensorMode():
        a = torch.empty(8, 64, 256, dtype=torch.bfloat16, device="cuda")
        w = torch.empty(8, 1004, 256, dtype=torch.bfloat16, device="cuda")
        masked_m = torch.empty(8, dtype=torch.int32, device="cuda")
        out = torch.empty(8, 64, 1004, dtype=torch.bfloat16, device="cuda")
        got, ops = traced(lambda: tilekiln.grouped_gemm_masked(a, w.transpose(1, 2), masked_m, bundle=bundle))
        assert ops == ["tilekiln.grouped_gemm_masked.default"]
        assert got.shape == (8, 64, 1004) and got.stride() == (64 * 1008, 1008, 1)
        _, ops = traced(lambda: bundle.grouped_gemm_masked(a, w.transpose(1, 2), masked_m, out=out))
        assert ops == ["tilekiln.grouped_gemm_masked_out.default"]


# -- tcgen05 (CC 10.x) -----------------------------------------------------------------------------

def _blackwell_bundle(tmp_path, kernels, cc=(10, 0), sms=148):
    """An sm_100a bundle (or sm_100f: ``kind`` f) of ``kernels`` on a stand-in device of ``cc``."""
    from tilekiln.bundle import Bundle, DeviceInfo
    from tests.records import manifest

    m = manifest(kernels)
    info = replace(m.bundle, name="sm100a", arch="sm_100a", compute_capability=(10, 0))
    return Bundle(tmp_path, replace(m, bundle=info), device_query=lambda ordinal: DeviceInfo(ordinal, cc, sms, "simulated GPU", 81920))


def _tcgen05(record, family="grouped"):
    """``record`` as the tcgen05 grouped template's kernel: pipeline sm100, 192 threads."""
    config = replace(record.config, pipeline="sm100", family=family)
    return replace(record, config=config, id=format_kernel_id(config), threads=192,
                   template=replace(record.template, name="sm100_grouped"))


def test_a_cc_10_device_runs_the_tcgen05_grouped_kernels_of_both_layouts(tmp_path):
    from tilekiln.grouped import choose_grouped, make_masked_problem

    contiguous = _tcgen05(grouped(0, (128, 256, 64)))
    masked = _tcgen05(grouped(1, (128, 128, 64)), "grouped_masked")
    fp8 = _tcgen05(grouped(2, (128, 256, 128), dtype="e4m3"))
    dense = replace(kernel_record(3, "dense", (128, 256, 64)), threads=192)
    bundle = _blackwell_bundle(tmp_path, (contiguous, masked, fp8, dense))
    assert choose_grouped(bundle, problem(4096, 8, n=1536)).kernel.id == contiguous.id == \
        "grouped_sm100_bf16_bf16_f32_bf16_tn_128x256x64_c1x1"
    assert choose_grouped(bundle, problem(4096, 8, n=1536, dtype="e4m3")).kernel.id == fp8.id
    rows = make_masked_problem(op("a", (8, 64, 512)), weights(8, 256, 512), op("masked_m", (8,), dtype="i32"),
                               None, False)
    assert choose_grouped(bundle, rows).kernel.id == masked.id == "grouped_masked_sm100_bf16_bf16_f32_bf16_tn_128x128x64_c1x1"
    # The host counts the same work-item bound on every arch: 148 SMs hold 148 one-CTA clusters.
    assert bundle.resident_clusters(contiguous, 0) == 148


def test_the_tcgen05_grouped_kernels_fuse_no_epilogue(tmp_path):
    """SwiGLU runs as the ungated grouped GEMM (torch pairs the columns); row-wise scales find no kernel."""
    from tilekiln.grouped import choose_grouped_fused
    from tilekiln.problem import requested_epilogue

    plain, fp8 = _tcgen05(grouped(0, (128, 256, 64))), _tcgen05(grouped(1, (128, 256, 128), dtype="e4m3"))
    bundle = _blackwell_bundle(tmp_path, (plain, fp8))
    swiglu = make_grouped_problem(op("a", (4096, 2048)), weights(8, 1536, 2048), op("offs", (8,), dtype="i32"), None,
                                  False, requested_epilogue(activation="swiglu"))
    choice, unfused = choose_grouped_fused(bundle, swiglu)
    assert choice.kernel.id == plain.id and unfused == (("activation", "swiglu"),)
    rowwise = make_grouped_problem(op("a", (4096, 2048), dtype="e4m3"), weights(8, 1536, 2048, "e4m3"),
                                   op("offs", (8,), dtype="i32"), None, True, requested_epilogue(scaling="rowwise"))
    assert choose_grouped_fused(bundle, rowwise)[0].kernel is None


def test_a_hopper_device_refuses_the_blackwell_grouped_bundle(tmp_path):
    from tilekiln.errors import BundleError
    from tilekiln.grouped import choose_grouped

    bundle = _blackwell_bundle(tmp_path, (_tcgen05(grouped(0, (128, 256, 64))),), cc=(9, 0), sms=132)
    with pytest.raises(BundleError, match="sm_100a"):
        choose_grouped(bundle, problem(4096, 8, n=1536))
