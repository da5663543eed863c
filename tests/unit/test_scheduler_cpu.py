"""The cluster-launch-control scheduler (kernel field ``scheduler``) without a GPU: the id token,
the plan the validator derives (a scheduler warp, the responses and their barriers in shared
memory), what the tcgen05 templates (dense, block-scaled, grouped) render for each scheduler, the
grouped walk's coverage under any cancellation order and row table, and selection: a clc kernel
wins the model's tie with its static twin and nothing else, dense, block-scaled and grouped."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import itertools
import random

import pytest

from tests.records import kernel_record, op, pick
from tilekiln._tensors import Operand
from tilekiln.blockscaled import block_request
from tilekiln.grouped import make_grouped_problem
from tilekiln.problem import make_problem
from tilekiln.select import choose, layout_code, shape_bucket
from tilekiln.spec import BlockScale, DType, KernelConfig, KernelIdError, Scheduler, format_kernel_id, parse_kernel_id

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
    choice = choose((STATIC, CLC), p, 148, pick())
    assert choice.kernel.id == CLC_ID and choice.how == "model"
    assert {c.estimate for c in choice.candidates} == {choice.candidates[0].estimate}  # priced the same
    assert choose((CLC, STATIC), p, 148, pick()).kernel.id == CLC_ID  # whatever the order
    assert str(choice).splitlines()[1].startswith(f"  accept {CLC_ID}:")
    # A cheaper kernel of another config still wins: the preference only breaks ties.
    skinny = problem(64, 4096, 4096)
    small_choice = choose((STATIC, CLC, SMALL), skinny, 148, pick())
    small = next(c for c in small_choice.candidates if c.kernel is SMALL)
    assert small.estimate < min(c.estimate for c in small_choice.candidates if c.kernel is not SMALL)
    assert small_choice.kernel is SMALL
    # A tuning table that measured the static kernel faster overrides the preference.
    tuned = choose((STATIC, CLC), p, 148, pick({shape_bucket(p, layout_code(p)): STATIC_ID}))
    assert (tuned.kernel.id, tuned.how) == (STATIC_ID, "tuned")


@pytest.fixture(scope="module")
def contexts():
    from builder.check.validate import Project, validate_project

    result = validate_project(Project(ROOT))
    return {c.entry.kernel_id: c for c in result.kernels}


GROUPED_CLC_ID = "grouped_sm100_bf16_bf16_f32_bf16_tn_128x256x64_c1x1_clc"


def test_every_clc_kernel_of_the_catalog_has_a_static_twin_of_its_template(contexts):
    clc = {i for i, c in contexts.items() if c.entry.config.scheduler is Scheduler.CLC}
    templates = {contexts[i].template.name for i in clc}
    assert templates == {"sm100_gemm", "sm100_blockscaled", "sm103_blockscaled", "sm100_grouped",
                         "sm100_blockscaled_grouped"}
    assert {CLC_ID, GROUPED_CLC_ID, "gemm_sm107_e4m3_e4m3_f32_bf16_tn_128x256x128_c2x1_2cta_clc"} <= clc
    for kernel_id in clc:
        twin = contexts[kernel_id.removesuffix("_clc")]
        assert twin.template.name == contexts[kernel_id].template.name, kernel_id
        # The same config but the scheduler: the same stages (the responses fit the barrier block's padding).
        assert twin.plan.stages == contexts[kernel_id].plan.stages, kernel_id
        assert contexts[kernel_id].plan.threads == twin.plan.threads + 32, kernel_id


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


def test_a_grouped_clc_kernel_launches_the_bound_and_stops_past_the_tables_count(contexts):
    from builder.render import render_kernel

    text = render_kernel(contexts[GROUPED_CLC_ID]).text
    assert "grid=[CLUSTER_M * bound, CLUSTER_N, 1]" in text and "resident_clusters)" not in text
    assert text.count("item = _next_item(clc, clc_state, responses, work_items)") == 3
    # The scheduler compares against the table's count, so it starts after the table is built.
    assert text.index("work_items = item_ends[groups]") < text.index("if warp == SCHED_WARP and rank == 0:")
    assert "while item < item_ends[group]:" in text and "item_stride" not in text
    plain = render_kernel(contexts[GROUPED_CLC_ID.removesuffix("_clc")]).text
    assert "grid=[CLUSTER_M, CLUSTER_N, clusters]" in plain and plain.count("item += item_stride") == 3
    assert "while item < item_ends[group]:" not in plain


def _walk(item_ends, item, group):
    """group_tile's cursor (common/persistent.j2) for a clc kernel: forward, then back."""
    while item >= item_ends[group + 1]:
        group += 1
    while item < item_ends[group]:
        group -= 1
    return group


def _table(offs, m, tile_rows, tiles_n):
    """build_table's item ends of a contiguous layout: each end clamped to [previous end, m]."""
    ends, items, prev = [0], [0], 0
    for off in offs:
        end = min(max(off, prev), m)
        items.append(items[-1] + -(-(end - prev) // tile_rows) * tiles_n)
        ends.append(end)
        prev = end
    return ends, items


@pytest.mark.parametrize("seed", range(20))
def test_the_grouped_clc_walk_takes_every_item_once_whatever_the_offsets_and_the_cancel_order(seed):
    """The host's bound (common/persistent.j2, group_clusters) covers the clamped table's count for
    any offs, as a CUDA graph replayed with new offs needs; clusters that take cancelled items in any
    order and stop at the first one past the count leave no item below it untaken or taken twice,
    and each item's group is the one its rows belong to."""
    rng = random.Random(seed)
    m, groups, tile_rows, tiles_n = rng.randint(1, 2000), rng.randint(1, 12), 128, rng.randint(1, 3)
    offs = sorted(rng.randint(0, m) for _ in range(groups))
    if seed % 3 == 0:  # offsets that break the contract: negative, decreasing, past total_M
        offs = [rng.randint(-300, m + 300) for _ in range(groups)]
    bound = (-(-m // tile_rows) + groups) * tiles_n
    row_ends, item_ends = _table(offs, m, tile_rows, tiles_n)
    count = item_ends[-1]
    assert count <= bound
    # Every launched or cancelled cluster id in [0, bound): a cluster runs its own id, then the ids
    # it cancels, in an order the hardware chooses (here shuffled), stopping past the count.
    pending = list(range(bound))
    rng.shuffle(pending)
    taken = []
    while pending:
        item = pending.pop()  # a cluster launches
        group = rng.randint(0, groups - 1)
        while item < count:
            group = _walk(item_ends, item, group)
            assert item_ends[group] <= item < item_ends[group + 1] and row_ends[group] < row_ends[group + 1]
            taken.append(item)
            item = pending.pop() if pending and rng.random() < 0.7 else count  # cancelled, or refused
    assert sorted(taken) == list(range(count))


def _twins(tile, **config):
    """A static kernel and its clc twin: sm100 records of ``tile`` with ``config`` replaced."""
    records, dtypes = [], config.pop("dtypes", ("bf16", "bf16", "f32", "bf16"))
    for index, scheduler in enumerate(("static", "clc")):
        r = kernel_record(index, "", tile, cluster=(1, 1), dtypes=dtypes, div=16, scheduler=scheduler)
        c = replace(r.config, pipeline="sm100", **config)
        records.append(replace(r, config=c, id=format_kernel_id(c)))
    return records


def test_the_model_prefers_the_block_scaled_and_the_grouped_clc_twins():
    mx = BlockScale(DType("e8m0"), 32)
    scaled = _twins((128, 256, 128), dtypes=("e4m3", "e4m3", "f32", "bf16"), block_scale=mx)
    a = Operand("a", (4096, 4096), (4096, 1), "e4m3", 1 << 20, 0, None)
    b = Operand("b", (4096, 4096), (1, 4096), "e4m3", 1 << 21, 0, None)
    asked = make_problem(a, b, None, "bf16", block_request("mxfp8"))
    grouped = _twins((128, 256, 64), family="grouped")
    p = make_grouped_problem(op("a", (8192, 2048)), op("b", (8, 2048, 4096), (4096 * 2048, 1, 2048)),
                             op("offs", (8,), dtype="i32"), None, False)
    for records, problem_, clc_id in ((scaled, asked, "gemm_sm100_e4m3_e4m3_f32_bf16_tn_128x256x128_c1x1_sfe8m0x32_clc"),
                                      (grouped, p, "grouped_sm100_bf16_bf16_f32_bf16_tn_128x256x64_c1x1_clc")):
        for order in itertools.permutations(records):
            choice = choose(order, problem_, 148, pick())
            assert choice.kernel.id == clc_id and choice.how == "model"
            assert len({c.estimate for c in choice.candidates}) == 1  # priced the same
