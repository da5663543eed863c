"""Property: what the validator accepts compiles; what it rejects would not have.

Hypothesis draws configs (bounded to a handful of compiles for CI time, and
derandomized so CI runs the same ones); the rejected ones break one field of
a good config per rule, so each of those rules is exercised. An accepted config must render,
compile deviceless for one of its targets, emit the family's MMA, spill
nothing and use exactly the shared memory the validator modelled. A
rejected config (one field of a good config broken) is rendered anyway from
its derived plan and compiled: it must fail to compile, or be rejected by a
rule whose diagnostic carries the hardware fact it violates (a launch would
fail or compute garbage; e.g. shared memory over the opt-in limit compiles).
Compiles run in a child process: some rejected configs abort the DSL.
"""

from __future__ import annotations

import multiprocessing
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool

import pytest
import yaml
from hypothesis import HealthCheck, assume, given, note, settings
from hypothesis import strategies as st

from builder.check.validate import Project, validate_project
from builder.compile.cubin import inspect_cubin
from builder.compile.job import CompileFailure, CompileJob, compile_job, prepare_worker
from builder.compile.objfile import cubins, fatbin
from builder.diagnostics import Severity
from builder.render import render_kernel
from tests.fixture_catalogs import make_project

pytestmark = pytest.mark.compile

PROPERTY = settings(max_examples=4, deadline=None, derandomize=True, database=None,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much,
                                           HealthCheck.function_scoped_fixture])
DTYPES = {"bf16": {"a": "bf16", "b": "bf16", "acc": "f32", "c": "bf16"},
          "f16": {"a": "f16", "b": "f16", "acc": "f32", "c": "f16"},
          "e4m3": {"a": "e4m3", "b": "e4m3", "acc": "f32", "c": "bf16"}}
TARGETS = {"sm90": ["sm_90a"], "sm100": ["sm_100a", "sm_100f", "sm_103a", "sm_107a"]}


class Compiler:
    """One spawned worker, replaced when a compile kills it."""

    def __init__(self):
        self.pool = None

    def __call__(self, job: CompileJob):
        if self.pool is None:
            self.pool = ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn"),
                                            initializer=prepare_worker)
        try:
            return self.pool.submit(compile_job, job).result()
        except BrokenProcessPool:
            self.pool = None
            return CompileFailure(job.kernel_id, job.arch, "the compiler process died", 0.0)

    def close(self):
        if self.pool is not None:
            self.pool.shutdown()


@pytest.fixture(scope="module")
def compiler():
    c = Compiler()
    yield c
    c.close()


@pytest.fixture(scope="module")
def project(tmp_path_factory):
    return make_project(tmp_path_factory.mktemp("property"), [])


def validate_one(project, item: dict):
    path = project / "catalog" / "gemm" / "drawn.yaml"
    path.write_text(yaml.safe_dump({"pipeline": item.pop("pipeline"), "targets": item.pop("targets"),
                                    "kernels": [item]}, sort_keys=False))
    result = validate_project(Project(project))
    (ctx,) = result.planned
    return ctx, [d for d in result.diagnostics if d.severity is Severity.ERROR]


@st.composite
def good_configs(draw):
    pipeline = draw(st.sampled_from(sorted(TARGETS)))
    item = {"pipeline": pipeline, "targets": [draw(st.sampled_from(TARGETS[pipeline]))],
            "dtypes": DTYPES[draw(st.sampled_from(sorted(DTYPES)))],
            "layout": draw(st.sampled_from(["tn", "nn", "nt", "tt"]))}
    if pipeline == "sm90":
        item["tile"] = [draw(st.sampled_from([64, 128])), draw(st.sampled_from([64, 128, 256])), 64]
        item["cluster"] = [draw(st.sampled_from([1, 2])), draw(st.sampled_from([1, 2]))]
    else:
        group = draw(st.sampled_from([1, 2]))
        item["cta_group"] = group
        item["tile"] = [128 if group == 2 else draw(st.sampled_from([64, 128])),
                        draw(st.sampled_from(range(16 * group, 257, 16 * group))), draw(st.sampled_from([32, 64]))]
        item["cluster"] = [group * draw(st.sampled_from([1, 2])), draw(st.sampled_from([1, 2, 4]))]
    item["stages"] = draw(st.one_of(st.just("auto"), st.integers(2, 4)))
    return item


# One field of a good sm100 config broken, each caught by a different rule.
MUTATIONS = {
    "MMA-TILE-M": {"tile": [96, 128, 64]},
    "MMA-TILE-N": {"tile": [128, 120, 64], "cta_group": 2, "cluster": [2, 1]},
    "MMA-TILE-K": {"tile": [128, 128, 24]},
    "CTA-PAIR": {"cta_group": 2, "cluster": [1, 2]},
    "SMEM-BUDGET": {"tile": [128, 256, 64], "stages": 7},
    "TEMPLATE-SUPPORT": {"tile": [128, 40, 64]},
}


@settings(PROPERTY, max_examples=6)
@given(item=good_configs())
def test_accepted_configs_compile(project, compiler, item):
    arch = item["targets"][0]
    ctx, errors = validate_one(project, dict(item))
    assume(not errors)
    note(ctx.entry.kernel_id)
    result = compiler(CompileJob(ctx.entry.kernel_id, arch, render_kernel(ctx).text))
    assert not isinstance(result, CompileFailure), result.message
    info = inspect_cubin(cubins(fatbin(result.object_bytes))[0])
    cfg = ctx.entry.config
    mma = {("sm90", 16): "HGMMA", ("sm90", 8): "QGMMA", ("sm100", 16): "UTCHMMA",
           ("sm100", 8): "UTCQMMA"}[(cfg.pipeline, cfg.dtypes.a.bits)]
    assert info.count(mma) > 0 and not info.spills
    assert result.traced_smem_bytes == ctx.plan.smem.dynamic_bytes
    assert info.static_smem_bytes == ctx.plan.smem.static_bytes


@pytest.mark.parametrize("rule", sorted(MUTATIONS))
@settings(PROPERTY, max_examples=1)
@given(dtype=st.sampled_from(["bf16", "f16"]), layout=st.sampled_from(["tn", "nt"]))
def test_rejected_configs_would_not_have_worked(project, compiler, rule, dtype, layout):
    item = {"pipeline": "sm100", "targets": ["sm_100a"], "dtypes": DTYPES[dtype], "layout": layout,
            "tile": [128, 128, 64], "cluster": [1, 1]} | MUTATIONS[rule]
    ctx, errors = validate_one(project, item)
    assert rule in {d.rule for d in errors}, [d.to_text() for d in errors]
    result = compiler(CompileJob(ctx.entry.kernel_id, "sm_100a", render_kernel(ctx).text))
    note(f"{ctx.entry.kernel_id}: {type(result).__name__}")
    if isinstance(result, CompileFailure):
        return
    explained = [d for d in errors if d.facts]
    assert explained, f"{ctx.entry.kernel_id} compiles, and no rejection names a hardware fact"
    if rule == "SMEM-BUDGET":
        (budget,) = [d for d in errors if d.rule == "SMEM-BUDGET"]
        assert budget.facts["smem_bytes"] > budget.facts["smem_budget"]
