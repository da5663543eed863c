"""Every rule has a failing fixture that reports it at the marked lines and a
passing fixture beside it; FACT-MISSING never falls back to another pipeline."""

from __future__ import annotations

import json

import pytest

from builder.check.rules import RULES
from builder.check.validate import Project, validate_project
from builder.diagnostics import Severity
from tests.fixture_catalogs import FIXTURES, expectations, found, make_project, overlay_files, validate_fixture

# Diagnostics that come from loading files rather than from RULES.
LOADER_IDS = ("YAML-SYNTAX", "TEMPLATE-AMBIGUOUS", "YAML-DUPLICATE-KEY", "CATALOG-SCHEMA", "CATALOG-INCOMPLETE", "CATALOG-SWEEP",
              "UNKNOWN-PIPELINE", "FACT-MISSING", "FACTS-SCHEMA", "FACTS-NAME", "TEMPLATE-MANIFEST",
              "YAML-ENCODING", "YAML-TAG", "YAML-LIMIT")
RULE_IDS = tuple(dict.fromkeys(r.id for r in RULES))
FAIL = [(d.name, f) for d in sorted(FIXTURES.iterdir()) if d.is_dir() for f in sorted(d.glob("fail*.yaml"))]
PASS = [(d.name, f) for d in sorted(FIXTURES.iterdir()) if d.is_dir() for f in sorted(d.glob("pass*.yaml"))]


def test_every_rule_and_loader_diagnostic_has_fixtures():
    have_fail = {rule for rule, _ in FAIL}
    have_pass = {rule for rule, _ in PASS}
    wanted = set(RULE_IDS) | set(LOADER_IDS)
    assert wanted - have_fail == set(), "rules without a failing fixture"
    assert wanted - have_pass == set(), "rules without a passing fixture"
    assert have_fail <= wanted, "fixture directories named after no rule"


def test_every_rule_is_documented(root):
    text = (root / "docs" / "catalog.md").read_text()
    undocumented = [r for r in (*RULE_IDS, *LOADER_IDS) if f"**{r}**" not in text and f"| {r} |" not in text]
    assert not undocumented, "add these to docs/catalog.md"


@pytest.mark.parametrize("rule, path", FAIL, ids=[f"{r}/{p.stem}" for r, p in FAIL])
def test_failing_fixture_reports_the_rule_at_the_marked_lines(tmp_path, rule, path):
    expected = {(e.file, e.line) for e in expectations(path, *overlay_files(path)) if e.rule == rule}
    assert expected, f"{path} marks no line with '# expect: {rule}'"
    diagnostics = validate_fixture(tmp_path, path)
    assert found(diagnostics, rule) == expected, [d.to_text() for d in diagnostics]
    for d in diagnostics:
        if d.rule == rule:
            assert d.message and d.hint, f"{rule} must say what is wrong and how to fix it: {d.to_text()}"


@pytest.mark.parametrize("rule, path", PASS, ids=[f"{r}/{p.stem}" for r, p in PASS])
def test_passing_fixture_does_not_report_the_rule(tmp_path, rule, path):
    diagnostics = validate_fixture(tmp_path, path)
    assert not found(diagnostics, rule), [d.to_text() for d in diagnostics]
    # Configs of pipelines no template serves report TEMPLATE-SUPPORT and
    # nothing else; every other error would mean the fixture is not clean.
    tolerated = set() if rule == "TEMPLATE-SUPPORT" else {"TEMPLATE-SUPPORT"}
    errors = [d for d in diagnostics if d.severity is Severity.ERROR and d.rule not in tolerated]
    assert not errors, [d.to_text() for d in errors]


def test_missing_fact_is_never_borrowed(tmp_path):
    """sm199 lacks cluster_dims_power_of_two: its 3x1 cluster gets FACT-MISSING,
    not sm100's power-of-two verdict, and the other rules still run."""
    diagnostics = validate_fixture(tmp_path, FIXTURES / "FACT-MISSING" / "fail.yaml")
    missing = [d for d in diagnostics if d.rule == "FACT-MISSING"]
    assert len(missing) == 1
    assert "cluster_dims_power_of_two" in missing[0].message and "CLUSTER-SHAPE" in missing[0].message
    assert not [d for d in diagnostics if d.rule == "CLUSTER-SHAPE"]
    assert {d.rule for d in diagnostics} == {"FACT-MISSING", "TEMPLATE-SUPPORT"}


def test_a_kernel_the_committed_tuning_table_names_is_not_shadowed(tmp_path):
    """The runtime picks a model-tied kernel where catalog/tuning/ names it, so SHADOWED stays quiet."""
    fixture = FIXTURES / "SHADOWED" / "fail.yaml"
    project = make_project(tmp_path, [fixture])
    (project / "catalog" / "tuning" / "sm100a").mkdir(parents=True)
    (project / "catalog" / "tuning" / "sm100a" / "b200.json").write_text(json.dumps(
        {"device": "NVIDIA B200", "compute_capability": [10, 0], "sm_count": 148, "memory_mib": 182630,
         "table": {"bf16/bf16->bf16:tn:4096x4096x4096:1": "gemm_sm100_bf16_bf16_f32_bf16_tn_128x128x64_c1x1/splitk2"}}))
    shadowed = [d for d in validate_project(Project(project)).diagnostics if d.rule == "SHADOWED"]
    assert len(shadowed) == 1 and "stages 6" in shadowed[0].message
