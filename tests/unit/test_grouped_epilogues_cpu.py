"""An expert MLP's grouped epilogues without a GPU (issue 32): the scale vectors' extents and glue,
the catalog's swiglu and row-wise grouped ids, the problem a gated call makes, selection with and
without a fusing kernel, the row-wise scale checks, explain, and the operators' fakes."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

import tilekiln
from tilekiln.bundle import Bundle, DeviceInfo
from tilekiln.grouped import choose_grouped_fused, make_grouped_problem, make_masked_problem
from tilekiln.problem import requested_epilogue
from tilekiln.select import check_kernel
from tilekiln.spec import FAMILIES, Activation, Scaling, format_kernel_id, parse_kernel_id
from tests.records import kernel_record, manifest, op
from tests.unit.test_grouped_cpu import weights
from tests.unit.test_torch_ops import traced

ROOT = Path(__file__).resolve().parents[2]
BF16, E4M3 = torch.bfloat16, torch.float8_e4m3fn
SWIGLU = requested_epilogue(activation="swiglu")
ROWWISE = requested_epilogue(scaling="rowwise")
ROWWISE_SWIGLU = requested_epilogue(scaling="rowwise", activation="swiglu")


def grouped(index, tile, family="grouped", dtype="bf16", schedule="cooperative", activation="none",
            scaling="tensor"):
    from tilekiln.spec import Schedule

    record = kernel_record(index, "x", tile, dtypes=(dtype, dtype, "f32", "bf16"))
    config = replace(record.config, family=family, schedule=Schedule(schedule), activation=Activation(activation),
                     scaling=Scaling(scaling))
    return replace(record, config=config, id=format_kernel_id(config))


PLAIN = grouped(0, (128, 128, 64))
GATED = grouped(1, (128, 128, 64), activation="swiglu")
FP8 = grouped(2, (128, 128, 128), dtype="e4m3")
FP8_ROWWISE = grouped(3, (128, 128, 128), dtype="e4m3", scaling="rowwise")
FP8_ROWWISE_GATED = grouped(4, (128, 128, 128), dtype="e4m3", scaling="rowwise", activation="swiglu")
MASKED_GATED = grouped(5, (64, 128, 64), family="grouped_masked", schedule="pingpong", activation="swiglu")


def bundle_of(tmp_path, *kernels) -> Bundle:
    return Bundle(tmp_path, manifest(kernels), device_query=lambda ordinal: DeviceInfo(ordinal, (9, 0), 132, "NVIDIA H200", 143156))


def offs(groups):
    return op("offs", (groups,), dtype="i32")


# -- the spec and the glue -----------------------------------------------------------------------

def test_row_wise_scale_vectors_span_the_extents_torch_scaled_grouped_mm_gives_them():
    assert [s.per for s in FAMILIES["gemm"].scales] == [("m",), ("n",)]
    assert [s.per for s in FAMILIES["grouped"].scales] == [("m",), ("n", "g")]
    assert [s.per for s in FAMILIES["grouped_masked"].scales] == [("m", "g"), ("n", "g")]


def test_glue_passes_each_row_wise_vector_the_product_of_its_extents():
    from builder.compile.objfile import EntryPoints
    from builder.package.link import LinkInput, render_glue

    entry = EntryPoints("p", "p_init", "p_load", "p_launch")
    text = render_glue("sm90a", [LinkInput(f"{f}_x", f, b"", entry) for f in FAMILIES])
    dense, grouped_, masked = (text.split(f"tk_run_{f}(const", 1)[1].split("int scaling", 1)[0] for f in FAMILIES)
    assert "scale_a_rows = {call->scale_a, {plan->m}}" in dense
    assert "scale_b_rows = {call->scale_b, {plan->n}}" in dense
    assert "scale_a_rows = {call->scale_a, {plan->m}}" in grouped_
    assert "scale_b_rows = {call->scale_b, {plan->n * plan->g}}" in grouped_
    assert "scale_a_rows = {call->scale_a, {plan->m * plan->g}}" in masked
    assert "scale_b_rows = {call->scale_b, {plan->n * plan->g}}" in masked


def test_the_catalogs_grouped_epilogue_kernels_round_trip_and_render_their_epilogue():
    from builder.check.validate import Project, validate_project
    from builder.render import render_kernel

    result = validate_project(Project(ROOT))
    ctxs = {c.entry.kernel_id: c for c in result.kernels
            if c.entry.config.family != "gemm" and (c.entry.config.activation.gated
                                                    or c.entry.config.scaling is Scaling.ROWWISE)}
    assert {"grouped_sm90_bf16_bf16_f32_bf16_tn_128x128x64_c1x1_swiglu",
            "grouped_sm90_bf16_bf16_f32_bf16_tn_64x128x64_c1x1_pingpong_swiglu",
            "grouped_sm90_e4m3_e4m3_f32_bf16_tn_128x256x128_c1x1_rowwise",
            "grouped_sm90_e4m3_e4m3_f32_bf16_tn_128x128x128_c1x1_rowwise_swiglu",
            "grouped_masked_sm90_bf16_bf16_f32_bf16_tn_64x256x64_c1x1_pingpong_swiglu",
            "grouped_masked_sm90_e4m3_e4m3_f32_bf16_tn_64x128x128_c1x1_pingpong_rowwise_swiglu"} <= set(ctxs)
    for kernel_id, ctx in ctxs.items():
        config = parse_kernel_id(kernel_id)
        assert format_kernel_id(config) == kernel_id and config == ctx.entry.config
        text = render_kernel(ctx).text
        assert f"GATED = {config.activation.gated}" in text
        assert f"ROWWISE = {config.scaling is Scaling.ROWWISE}" in text and "PER_VALUE = GATED or ROWWISE" in text
        # Shared with the dense template, not copied: the gated value and the row-wise read.
        assert "def _glu_value(gate, up, gate_scale=None, up_scale=None):" in text and "def _scale_at(" in text
        if config.scaling is Scaling.ROWWISE:
            per = "cute.sym_int32(symbol=\"NG\")"
            assert f"scale_b = make_fake_tensor(cutlass.Float32, ({per},), (1,), assumed_align=4)" in text
            # Row-wise kernels do not take the per-tensor product.
            assert "SCALED = False" in text


def test_the_existing_grouped_kernels_render_without_the_per_value_epilogue():
    from builder.check.validate import Project, validate_project
    from builder.render import render_kernel

    result = validate_project(Project(ROOT))
    ctx = next(c for c in result.kernels if c.entry.kernel_id == "grouped_sm90_e4m3_e4m3_f32_bf16_tn_128x128x128_c1x1")
    text = render_kernel(ctx).text
    assert "SCALED = True" in text and "ROWWISE = False" in text and "GATED = False" in text


# -- the problem and the choice ------------------------------------------------------------------

def test_a_gated_problem_has_half_the_columns_and_pads_their_rows():
    p = make_grouped_problem(op("a", (300, 512)), weights(8, 2 * 1000, 512), offs(8), None, False, SWIGLU)
    assert (p.n, p.out_n, p.out_shape, p.c.lead) == (2000, 1000, (300, 1000), 1000)
    q = make_masked_problem(op("a", (8, 64, 512)), weights(8, 2 * 1004, 512), op("masked_m", (8,), dtype="i32"),
                            None, False, SWIGLU)
    # 1004 bf16 columns are 2008 bytes: the rows are padded to 1008 elements.
    assert (q.out_shape, q.c.lead, q.c.batch) == ((8, 64, 1004), 1008, 64 * 1008)


def test_a_gated_problem_refuses_odd_columns_and_an_out_of_the_ungated_shape():
    with pytest.raises(ValueError, match="b: 999 columns, an odd count"):
        make_grouped_problem(op("a", (8, 64)), weights(2, 999, 64), offs(2), None, False, SWIGLU)
    with pytest.raises(ValueError, match=r"out: shape \[8, 256\] does not match the result shape \[8, 128\]"):
        make_grouped_problem(op("a", (8, 64)), weights(2, 256, 64), offs(2), op("out", (8, 256)), False, SWIGLU)


def test_only_a_kernel_with_the_requested_epilogue_runs_it():
    gated = make_grouped_problem(op("a", (1024, 512)), weights(8, 1024, 512), offs(8), None, False, SWIGLU)
    assert check_kernel(GATED, gated) is None
    assert check_kernel(PLAIN, gated) == "activation: kernel computes none, the call asks for swiglu"
    assert check_kernel(GATED, replace(gated, requested=())) == "activation: kernel computes swiglu, the call asks for none"
    # I = 480 is not a whole number of 64-row gate blocks.
    odd = make_grouped_problem(op("a", (1024, 512)), weights(8, 960, 512), offs(8), None, False, SWIGLU)
    assert check_kernel(GATED, odd).startswith("swiglu: I = N/2 = 480")
    fp8 = make_grouped_problem(op("a", (1024, 512), dtype="e4m3"), weights(8, 1024, 512, "e4m3"), offs(8), None,
                               True, ROWWISE_SWIGLU)
    assert check_kernel(FP8_ROWWISE_GATED, fp8) is None
    assert check_kernel(FP8_ROWWISE, fp8) == "activation: kernel computes none, the call asks for swiglu"
    assert check_kernel(FP8, replace(fp8, requested=ROWWISE)) == \
        "scaling: kernel computes tensor, the call asks for rowwise"


def test_a_swiglu_no_kernel_fuses_runs_the_ungated_gemm_and_leaves_the_pairing(tmp_path):
    problem = make_grouped_problem(op("a", (1024, 512)), weights(8, 1024, 512), offs(8), None, False, SWIGLU)
    choice, unfused = choose_grouped_fused(bundle_of(tmp_path, PLAIN, GATED), problem)
    assert choice.kernel is GATED and unfused == ()
    choice, unfused = choose_grouped_fused(bundle_of(tmp_path / "plain", PLAIN), problem)
    assert choice.kernel is PLAIN and unfused == (("activation", "swiglu"),)
    # The kernel writes all N columns into a result of its own, whose rows are padded for N.
    assert choice.run.out_shape == (1024, 1024) and choice.run.requested == ()
    # Row-wise scales are the mainloop's contract: no kernel with them, no choice.
    fp8 = make_grouped_problem(op("a", (1024, 512), dtype="e4m3"), weights(8, 1024, 512, "e4m3"), offs(8), None,
                               True, ROWWISE)
    choice, unfused = choose_grouped_fused(bundle_of(tmp_path / "fp8", FP8), fp8)
    assert choice.kernel is None and unfused == ()


# -- the row-wise scale checks --------------------------------------------------------------------

def test_scales_are_read_as_torch_scaled_grouped_mm_reads_them():
    from tilekiln._torch.scales import grouped_scaling

    one = torch.ones(1)
    assert grouped_scaling(None, None) == "none"
    assert grouped_scaling(one, one) == "tensor"
    assert grouped_scaling(one, None) == "tensor"  # whose check then names scale_b
    assert grouped_scaling(torch.ones(300), torch.ones(8, 1000)) == "rowwise"
    assert grouped_scaling(torch.ones(300, 1), one) == "rowwise"


A, B = torch.empty(300, 64), torch.empty(8, 64, 1000)
MA = torch.empty(8, 16, 64)


@pytest.mark.parametrize("scale_a, scale_b, masked", [
    (torch.ones(300), torch.ones(8, 1000), False),
    (torch.ones(300, 1), torch.ones(8, 1, 1000), False),
    (torch.ones(8, 16), torch.ones(8, 1000), True),
    (torch.ones(8, 16, 1), torch.ones(8, 1, 1000), True),
])
def test_row_wise_scales_of_torchs_shapes_pass(scale_a, scale_b, masked):
    from tilekiln._torch.scales import check_grouped_scales

    check_grouped_scales(MA if masked else A, B, scale_a, scale_b, masked)


@pytest.mark.parametrize("scale_a, scale_b, masked, exc, text", [
    ([1.0] * 300, torch.ones(8, 1000), False, TypeError, "scale_a: expected a contiguous float32 tensor (300,) or "
     "(300, 1) (one per row of a) for row-wise scales, got list"),
    (torch.ones(299), torch.ones(8, 1000), False, ValueError, "scale_a: expected a contiguous float32 tensor (300,) "
     "or (300, 1) (one per row of a) on the inputs' device for row-wise scales; got shape [299]"),
    (torch.ones(300, dtype=torch.float64), torch.ones(8, 1000), False, ValueError, "dtype torch.float64"),
    (torch.ones(300), torch.ones(1000, 8).t(), False, ValueError, "scale_b: expected a contiguous float32 tensor "
     "(8, 1000) or (8, 1, 1000) (one per group and column of b) on the inputs' device for row-wise scales; got "
     "strides [1, 8] (call .contiguous())"),
    (torch.ones(300), torch.ones(1, 1000), False, ValueError, "scale_b: expected a contiguous float32 tensor (8, 1000)"),
    (torch.ones(300), torch.ones(8, 1000, device="meta"), False, ValueError, "got device meta"),
    (torch.ones(128), torch.ones(8, 1000), True, ValueError, "scale_a: expected a contiguous float32 tensor (8, 16) "
     "or (8, 16, 1) (one per row of a)"),
])
def test_row_wise_scale_errors_name_the_argument(scale_a, scale_b, masked, exc, text):
    from tilekiln._torch.scales import check_grouped_scales

    with pytest.raises(exc) as info:
        check_grouped_scales(MA if masked else A, B, scale_a, scale_b, masked)
    assert text in str(info.value)


def test_calls_that_cannot_run_raise_before_anything_is_launched(tmp_path):
    bundle = bundle_of(tmp_path, FP8_ROWWISE)
    a8, w8 = torch.empty(256, 128, dtype=E4M3), torch.empty(2, 256, 128, dtype=E4M3)
    rows = torch.tensor([100, 256], dtype=torch.int32)
    with pytest.raises(ValueError, match="a: tensor is in host memory"):
        bundle.grouped_gemm(a8, w8.transpose(1, 2), rows, scale_a=torch.ones(256), scale_b=torch.ones(2, 256))
    with pytest.raises(TypeError, match=r"grouped_swiglu takes torch tensors \(a and w_gate_up\)"):
        bundle.grouped_swiglu(a8, [1.0], rows)
    with pytest.raises(ValueError, match=r"w_gate_up: expected \(G, 2I, K\) with K = a's last dimension"):
        bundle.grouped_swiglu(a8, torch.empty(2, 255, 128, dtype=E4M3), rows)
    with pytest.raises(TypeError, match="w_gate_up: dtype torch.bfloat16 is not a's"):
        bundle.grouped_swiglu(a8, torch.empty(2, 256, 128, dtype=BF16), rows)
    with pytest.raises(TypeError, match="grouped_swiglu takes torch tensors"):
        tilekiln.grouped_swiglu([[1.0]], w8, rows)
    with pytest.raises(RuntimeError, match="grouped_swiglu_masked is not differentiable"):
        tilekiln.grouped_swiglu_masked(torch.zeros(2, 8, 128, requires_grad=True), torch.zeros(2, 256, 128), rows,
                                       bundle=bundle)


# -- explain and the operators --------------------------------------------------------------------

def test_explain_says_whether_swiglu_and_row_wise_scales_are_fused(tmp_path):
    with FakeTensorMode():
        a = torch.empty(4096, 512, dtype=BF16, device="cuda")
        w = torch.empty(8, 1024, 512, dtype=BF16, device="cuda")
        rows = torch.empty(8, dtype=torch.int32, device="cuda")
        fused = tilekiln.explain(a, w.transpose(1, 2), offs=rows, activation="swiglu",
                                 bundle=bundle_of(tmp_path, PLAIN, GATED))
        assert fused.kernel.id == GATED.id and not fused.notes
        unfused = tilekiln.explain(a, w.transpose(1, 2), offs=rows, activation="swiglu",
                                   bundle=bundle_of(tmp_path / "plain", PLAIN))
        assert unfused.kernel.id == PLAIN.id
        assert unfused.notes == (f"unfused: no kernel computes activation swiglu; torch applies it after {PLAIN.id}",)
        a8, w8 = a.to(E4M3), w.to(E4M3)
        fp8 = bundle_of(tmp_path / "fp8", FP8, FP8_ROWWISE, FP8_ROWWISE_GATED)
        assert tilekiln.explain(a8, w8.transpose(1, 2), offs=rows, bundle=fp8).kernel.id == FP8.id
        assert tilekiln.explain(a8, w8.transpose(1, 2), offs=rows, scale_format="rowwise",
                                bundle=fp8).kernel.id == FP8_ROWWISE.id
        assert tilekiln.explain(a8, w8.transpose(1, 2), offs=rows, scale_format="rowwise", activation="swiglu",
                                bundle=fp8).kernel.id == FP8_ROWWISE_GATED.id
        masked = tilekiln.explain(a.reshape(8, 512, 512), w.transpose(1, 2), masked_m=rows, activation="swiglu",
                                  bundle=bundle_of(tmp_path / "masked", MASKED_GATED))
        assert masked.kernel.id == MASKED_GATED.id
        with pytest.raises(ValueError, match="activation: grouped kernels fuse 'swiglu'"):
            tilekiln.explain(a, w.transpose(1, 2), offs=rows, activation="silu", bundle=fp8)
        # Blockwise scales run only on a blockwise kernel, which this bundle lacks.
        assert tilekiln.explain(a8, w8.transpose(1, 2), offs=rows, scale_format="blockwise",
                                bundle=fp8).kernel is None
        with pytest.raises(ValueError, match="scale_format: grouped calls read per-tensor or row-wise scales from "
                                             "their shapes"):
            tilekiln.explain(a8, w8.transpose(1, 2), offs=rows, scale_format="columnwise", bundle=fp8)


def test_the_grouped_swiglu_operators_trace_as_one_node_with_half_the_columns(tmp_path):
    bundle = bundle_of(tmp_path)
    with FakeTensorMode():
        a = torch.empty(300, 256, dtype=BF16, device="cuda")
        w = torch.empty(8, 2 * 1004, 256, dtype=BF16, device="cuda")
        rows = torch.empty(8, dtype=torch.int32, device="cuda")
        got, ops = traced(lambda: tilekiln.grouped_swiglu(a, w, rows, bundle=bundle))
        assert ops == ["tilekiln.grouped_gemm.default"]
        # 1004 bf16 columns: a padded view, as the eager call allocates it.
        assert got.shape == (300, 1004) and got.stride() == (1008, 1) and got.dtype == BF16
        a8, w8 = a.to(E4M3), w.to(E4M3)
        scale_a, scale_b = torch.empty(300, device="cuda"), torch.empty(8, 2008, device="cuda")
        got, ops = traced(lambda: bundle.grouped_swiglu(a8, w8, rows, scale_a=scale_a, scale_b=scale_b))
        assert ops == ["tilekiln.grouped_gemm.default"] and got.shape == (300, 1004) and got.dtype == BF16
        am = torch.empty(8, 64, 256, dtype=BF16, device="cuda")
        got, ops = traced(lambda: tilekiln.grouped_swiglu_masked(am, w, rows, bundle=bundle))
        assert ops == ["tilekiln.grouped_gemm_masked.default"]
        assert got.shape == (8, 64, 1004) and got.stride() == (64 * 1008, 1008, 1)
        out = torch.empty(8, 64, 1004, dtype=BF16, device="cuda")
        _, ops = traced(lambda: tilekiln.grouped_swiglu_masked(am, w, rows, out=out, bundle=bundle))
        assert ops == ["tilekiln.grouped_gemm_masked_out.default"]


def test_the_grouped_operators_schemas_take_the_activation_and_the_scale_format_last_with_defaults():
    import tilekiln._torch.ops  # noqa: F401  (registers the operators)

    for name in ("grouped_gemm", "grouped_gemm_out", "grouped_gemm_masked", "grouped_gemm_masked_out"):
        schema = getattr(torch.ops.tilekiln, name).default._schema
        assert [(x.name, x.default_value) for x in schema.arguments[-2:]] == [("activation", "none"),
                                                                              ("scale_format", "")]


def test_swiglu_weight_interleaves_each_experts_gate_and_up():
    gate = torch.arange(2 * 130 * 3, dtype=torch.float64).reshape(2, 130, 3)
    up = -gate
    w = tilekiln.swiglu_weight(gate, up)
    assert w.shape == (2, 260, 3) and w.is_contiguous()
    for g in range(2):
        torch.testing.assert_close(w[g], tilekiln.swiglu_weight(gate[g], up[g]))
    torch.testing.assert_close(tilekiln.swiglu_weight(torch.cat((gate, up), dim=1)), w)
