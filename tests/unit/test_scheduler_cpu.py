"""The cluster-launch-control scheduler (kernel field ``scheduler``) without a GPU: the id token,
the plan the validator derives (a scheduler warp, the responses and their barriers in shared
memory), what the tcgen05 template renders for each scheduler, and selection: a clc kernel wins
the model's tie with its static twin and nothing else."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from tests.records import kernel_record
from tilekiln._tensors import Operand
from tilekiln.problem import make_problem
from tilekiln.select import choose, layout_code, shape_bucket
from tilekiln.spec import KernelConfig, KernelIdError, Scheduler, format_kernel_id, parse_kernel_id

ROOT = Path(__file__).resolve().parents[2]
CLC_ID = "gemm_sm100_bf16_bf16_f32_bf16_tn_128x256x64_c2x1_2cta_clc"
STATIC_ID = CLC_ID.removesuffix("_clc")


def sm100(record):
    """The sm90 test record as an sm100 kernel (selection reads no pipeline; the config should be real)."""
    return replace(record, config=replace(record.config, pipeline="sm100", cta_group=2))


STATIC = sm100(kernel_record(0, STATIC_ID, (128, 256, 64), cluster=(2, 1)))
CLC = sm100(kernel_record(1, CLC_ID, (128, 256, 64), cluster=(2, 1), scheduler="clc"))
SMALL = sm100(kernel_record(2, "gemm_sm100_bf16_bf16_f32_bf16_tn_64x128x64_c1x1", (64, 128, 64)))


def _op(name, shape, strides):
    return Operand(name, shape, strides, "bf16", 0x1000, 0, None)


def problem(m, n, k):
    return make_problem(_op("a", (m, k), (k, 1)), _op("b", (k, n), (1, k)), None)


def test_the_id_token_is_clc_only_for_the_non_default_value():
    config = parse_kernel_id(CLC_ID)
    assert config.scheduler is Scheduler.CLC and format_kernel_id(config) == CLC_ID
    assert parse_kernel_id(STATIC_ID).scheduler is Scheduler.STATIC
    assert KernelConfig.from_plain(config.plain()) == config and config.plain()["scheduler"] == "clc"
    # A manifest written before the field (schema 2.4) reads as static.
    plain = config.plain()
    del plain["scheduler"]
    assert KernelConfig.from_plain(plain).scheduler is Scheduler.STATIC
    with pytest.raises(KernelIdError):
        parse_kernel_id(STATIC_ID + "_static")  # the default is never spelled
    with pytest.raises(KernelIdError, match="not a kernel id"):
        parse_kernel_id(STATIC_ID.replace("_2cta", "_clc_2cta"))  # options out of order


def test_the_model_prefers_the_clc_twin_and_only_on_a_tie():
    p = problem(4096, 4096, 4096)
    choice = choose((STATIC, CLC), p, 148, {})
    assert choice.kernel.id == CLC_ID and choice.how == "model"
    assert {c.estimate for c in choice.candidates} == {choice.candidates[0].estimate}  # priced the same
    assert choose((CLC, STATIC), p, 148, {}).kernel.id == CLC_ID  # whatever the order
    assert str(choice).splitlines()[1].startswith(f"  accept {CLC_ID}:")
    # A cheaper kernel of another config still wins: the preference only breaks ties.
    skinny = problem(64, 4096, 4096)
    small_choice = choose((STATIC, CLC, SMALL), skinny, 148, {})
    small = next(c for c in small_choice.candidates if c.kernel is SMALL)
    assert small.estimate < min(c.estimate for c in small_choice.candidates if c.kernel is not SMALL)
    assert small_choice.kernel is SMALL
    # A tuning table that measured the static kernel faster overrides the preference.
    tuned = choose((STATIC, CLC), p, 148, {shape_bucket(p, layout_code(p)): STATIC_ID})
    assert (tuned.kernel.id, tuned.how) == (STATIC_ID, "tuned")


@pytest.fixture(scope="module")
def contexts():
    from builder.check.validate import Project, validate_project

    result = validate_project(Project(ROOT))
    return {c.entry.kernel_id: c for c in result.kernels}


def test_every_clc_kernel_of_the_catalog_has_a_static_twin_and_no_other_template(contexts):
    clc = {i for i, c in contexts.items() if c.entry.config.scheduler is Scheduler.CLC}
    assert CLC_ID in clc and "gemm_sm107_e4m3_e4m3_f32_bf16_tn_128x256x128_c2x1_2cta_clc" in clc
    for kernel_id in clc:
        assert kernel_id.removesuffix("_clc") in contexts, kernel_id
        assert contexts[kernel_id].template.name == "sm100_gemm", kernel_id


def test_the_plan_adds_the_scheduler_warp_and_the_responses(contexts):
    clc, static = contexts[CLC_ID], contexts[STATIC_ID]
    p, facts = clc.template.manifest.parameters, clc.facts
    assert (clc.plan.threads, static.plan.threads) == (p.threads + p.scheduler_threads, p.threads) == (224, 192)
    assert (clc.plan.clc_stages, static.plan.clc_stages) == (p.clc_stages, 0) == (1, 0)
    response = facts.require("clc_response_bytes")
    assert response == 16
    extra = p.clc_stages * (response + 2 * facts.require("mbarrier_bytes"))
    assert clc.plan.smem.barrier_bytes - static.plan.smem.barrier_bytes == extra == 32
    # The barrier block is padded to the 1024-byte buffer alignment: the same stages fit.
    assert clc.plan.stages == static.plan.stages and clc.plan.smem.dynamic_bytes == static.plan.smem.dynamic_bytes


def test_the_template_launches_every_tile_and_asks_the_hardware_for_the_next(contexts):
    from builder.render import render_kernel

    text = render_kernel(contexts[CLC_ID]).text
    assert "grid=[CLUSTER_M * work_items, CLUSTER_N, 1]" in text
    assert "cute.arch.issue_clc_query(" in text and "cute.arch.clc_response(" in text
    assert "if warp == SCHED_WARP and rank == 0:" in text
    assert "first_item = cute.arch.cluster_idx()[0]" in text
    # Each consumer role reads the next response instead of striding.
    assert text.count("item = _next_item(clc, clc_state, responses, work_items)") == 3
    assert "item_stride" not in text and "resident_clusters)" not in text
    plain = render_kernel(contexts[STATIC_ID]).text
    assert "grid=[CLUSTER_M, CLUSTER_N, clusters]" in plain
    assert "clc" not in plain.lower().replace("cluster", "") and plain.count("item += item_stride") == 3
