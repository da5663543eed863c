"""The epilogue's alpha and beta (kernel field ``scalars``) without a GPU: the id token, what the
sm90 template renders, and selection: only a kernel with them runs a call that passes them, and
no other call ever runs one."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from tests.records import kernel_record, pick
from tilekiln._tensors import Operand
from tilekiln.problem import make_problem, requested_epilogue
from tilekiln.select import check_kernel, choose, choose_fused
from tilekiln.spec import KernelConfig, KernelIdError, Scalars, format_kernel_id, parse_kernel_id

ROOT = Path(__file__).resolve().parents[2]
ADDMM_ID = "gemm_sm90_bf16_bf16_f32_bf16_tn_128x256x64_c2x1_resadd_alphabeta_sw8"

PLAIN = kernel_record(0, "k0", (128, 256, 64))
RESIDUAL = kernel_record(1, "k1_resadd", (128, 256, 64), residual="add")
ALPHA = kernel_record(2, "k2_alphabeta", (128, 256, 64), scalars="alphabeta")
ADDMM = kernel_record(3, "k3_resadd_alphabeta", (128, 256, 64), residual="add", scalars="alphabeta")
KERNELS = (PLAIN, RESIDUAL, ALPHA, ADDMM)


def _op(name, shape, strides):
    return Operand(name, shape, strides, "bf16", 0x1000, 0, None)


def problem(m, n, k, **asked):
    p = make_problem(_op("a", (m, k), (k, 1)), _op("b", (k, n), (1, k)), None)
    return replace(p, requested=requested_epilogue(**asked))


def fused(p, kernels=KERNELS):
    choice, unfused = choose_fused(lambda q: choose(kernels, q, 132, pick()), p)
    return (choice.kernel.id if choice.kernel else None), unfused


def test_the_id_token_follows_the_residual_and_round_trips():
    config = parse_kernel_id(ADDMM_ID)
    assert config.scalars is Scalars.ALPHA_BETA and config.residual.value == "add"
    assert format_kernel_id(config) == ADDMM_ID
    assert KernelConfig.from_plain(config.plain()) == config
    assert config.plain()["scalars"] == "alphabeta"
    # A manifest written before the field reads as none.
    plain = config.plain()
    del plain["scalars"]
    assert KernelConfig.from_plain(plain).scalars is Scalars.NONE
    plain_id = format_kernel_id(replace(config, scalars=Scalars.NONE))
    assert "alphabeta" not in plain_id and parse_kernel_id(plain_id).scalars is Scalars.NONE
    with pytest.raises(KernelIdError, match="not a kernel id"):
        parse_kernel_id(ADDMM_ID.replace("_resadd_alphabeta", "_alphabeta_resadd"))  # options out of order
    with pytest.raises(KernelIdError):
        parse_kernel_id(ADDMM_ID.replace("alphabeta", "alpha"))


def test_only_a_kernel_with_alpha_and_beta_runs_a_call_that_passes_them_and_no_other_call():
    assert check_kernel(ADDMM, problem(1024, 1024, 1024, residual="add")) == \
        "scalars: kernel computes alphabeta, the call asks for none"
    assert check_kernel(RESIDUAL, problem(1024, 1024, 1024, residual="add", scalars="alphabeta")) == \
        "scalars: kernel computes none, the call asks for alphabeta"
    assert fused(problem(1024, 1024, 1024)) == ("k0", ())
    assert fused(problem(1024, 1024, 1024, residual="add")) == ("k1_resadd", ())
    assert fused(problem(1024, 1024, 1024, residual="add", scalars="alphabeta")) == ("k3_resadd_alphabeta", ())
    assert fused(problem(1024, 1024, 1024, scalars="alphabeta")) == ("k2_alphabeta", ())
    # Without the fused residual, the alpha kernel runs and the residual is left to the caller
    # (which adds beta * residual); alpha is never dropped to a kernel without it.
    assert fused(problem(1024, 1024, 1024, residual="add", scalars="alphabeta"), (PLAIN, RESIDUAL, ALPHA)) == \
        ("k2_alphabeta", (("residual", "add"),))
    kernel, _ = fused(problem(1024, 1024, 1024, residual="add", scalars="alphabeta"), (PLAIN, RESIDUAL))
    assert kernel is None


@pytest.fixture(scope="module")
def contexts():
    from builder.check.validate import Project, validate_project

    result = validate_project(Project(ROOT))
    return {c.entry.kernel_id: c for c in result.kernels}


def test_the_catalog_holds_alpha_beta_kernels_with_and_without_the_residual(contexts):
    ids = {i for i in contexts if "alphabeta" in i}
    assert ADDMM_ID in ids
    assert {i.replace("_resadd", "") for i in ids if "_resadd" in i} == {i for i in ids if "_resadd" not in i}
    assert all(contexts[i].entry.config.dtypes.tokens == ("bf16", "bf16", "f32", "bf16") for i in ids)


def test_the_template_scales_the_product_by_alpha_and_the_residual_by_beta(contexts):
    from builder.render import render_kernel

    text = render_kernel(contexts[ADDMM_ID]).text
    assert "ALPHA_BETA = True" in text and "MULTIPLIED = SCALED or ALPHA_BETA" in text
    assert "scale_a, scale_b, residual, alpha, beta, tiled_mma," in text
    assert "alpha: cutlass.Float32, beta: cutlass.Float32," in text
    assert "value = value + beta * residual[mma_row, mma_col, tb].to(cutlass.Float32)" in text
    assert "out = alpha * acc + beta * residual" in text
    plain = render_kernel(contexts[ADDMM_ID.replace("_resadd_alphabeta", "_resadd")]).text
    assert "ALPHA_BETA = False" in plain and "residual, alpha, beta, tiled_mma" not in plain
    assert "alpha * acc" not in plain
