"""Diagnostics stay records to the CLI's output: the kernel id is a field, JSON carries the YAML
path and the facts, GitHub annotations survive any file name. Assertions are on (rule, subject,
location) and on facts, never on wording."""

from __future__ import annotations

import json
import pickle
import re
from pathlib import Path

from click.testing import CliRunner

from builder.check.validate import Project, validate_project
from builder.cli.commands import main
from builder.compile.job import COMPILE_HINTS
from builder.diagnostics import Diagnostic, DiagnosticError, Location, Severity, render
from tests.fixture_catalogs import FIXTURES, expectations, make_project, overlays, validate_fixture


def _marked(fixture: Path, rule: str) -> set[tuple[str, int]]:
    return {(e.file, e.line) for e in expectations(fixture) if e.rule == rule}


def test_a_kernel_rule_names_its_kernel_in_subject_not_in_the_message(tmp_path):
    fixture = FIXTURES / "SWIZZLE" / "fail.yaml"
    project = make_project(tmp_path, [fixture], overlays(fixture))
    result = validate_project(Project(project))
    (d,) = [d for d in result.diagnostics if d.rule == "SWIZZLE"]
    (ctx,) = [c for c in result.planned if c.entry.config.swizzle == d.facts["swizzle"]]
    assert (d.rule, d.subject) == ("SWIZZLE", ctx.entry.kernel_id)
    assert {(Path(d.location.file).name, d.location.line)} == _marked(fixture, "SWIZZLE")
    assert d.location.path == f"kernels[{ctx.entry.item}].swizzle"
    assert not d.message.startswith(d.subject) and d.subject not in d.message
    # People still read the id first on the text line.
    assert f"SWIZZLE: {d.subject}: {d.message}" in d.to_text()


def test_file_level_problems_have_no_subject(tmp_path):
    diagnostics = validate_fixture(tmp_path, FIXTURES / "YAML-DUPLICATE-KEY" / "fail.yaml")
    assert [(d.rule, d.subject) for d in diagnostics] == [("YAML-DUPLICATE-KEY", None)]


def _json(project: Path, *args: str) -> list[dict]:
    result = CliRunner().invoke(main, ["--root", str(project), "validate", "--format", "json", *args])
    assert result.exit_code == 1, result.output
    return json.loads(result.stdout)


def test_json_carries_facts_subject_and_yaml_path_of_a_rule(tmp_path):
    fixture = FIXTURES / "SMEM-BUDGET" / "fail.yaml"
    (r,) = [r for r in _json(make_project(tmp_path, [fixture])) if r["rule"] == "SMEM-BUDGET"]
    assert {(Path(r["location"]["file"]).name, r["location"]["line"])} == _marked(fixture, "SMEM-BUDGET")
    assert r["location"]["path"] == "kernels[0].stages" and r["location"]["column"] == 5
    assert r["subject"] == "gemm_sm100_bf16_bf16_f32_bf16_tn_128x256x64_c1x1_s8" and r["severity"] == "error"
    facts = r["facts"]
    assert facts["stages"] == 8 and facts["max_stages"] < 8 and facts["smem_bytes"] > facts["smem_budget"]


def test_json_carries_facts_and_yaml_path_of_loader_diagnostics(tmp_path):
    records = _json(make_project(tmp_path, [FIXTURES / "CATALOG-SCHEMA" / "fail.yaml"]))
    by_path = {r["location"]["path"]: r for r in records if r["rule"] == "CATALOG-SCHEMA"}
    typo = by_path["kernels[0].clustr"]
    assert typo["subject"] is None and typo["location"]["line"] == 8
    assert typo["facts"] == {"pydantic_types": ["extra_forbidden"], "did_you_mean": "cluster"}
    dtype = by_path["kernels[3].dtypes.c"]
    assert dtype["facts"]["input"] == "bf15" and dtype["facts"]["did_you_mean"] == "bf16"
    assert dtype["facts"]["pydantic_types"] == ["enum"]

    (dup,) = _json(make_project(tmp_path / "dup", [FIXTURES / "YAML-DUPLICATE-KEY" / "fail.yaml"]))
    assert (dup["rule"], dup["subject"], dup["location"]["line"], dup["location"]["path"]) == (
        "YAML-DUPLICATE-KEY", None, 8, "kernels[0].tile")
    assert dup["facts"] == {"key": "tile", "first_line": 7, "first_column": 5}


def test_explain_lists_the_problems_whose_subject_is_the_kernel(tmp_path):
    fixture = FIXTURES / "SWIZZLE" / "fail.yaml"
    project = make_project(tmp_path, [fixture], overlays(fixture))
    (d,) = [d for d in validate_project(Project(project)).diagnostics if d.rule == "SWIZZLE"]
    result = CliRunner().invoke(main, ["--root", str(project), "validate", "--explain", d.subject])
    assert result.exit_code == 0, result.output
    problems = json.loads(result.stdout)["problems"]
    assert [(p["rule"], p["subject"], p["location"]["path"]) for p in problems] == [
        ("SWIZZLE", d.subject, d.location.path)]


def _unescape_data(text: str) -> str:
    """What GitHub's runner makes of escaped data (actions/toolkit command.ts, in reverse)."""
    return text.replace("%0D", "\r").replace("%0A", "\n").replace("%25", "%")


def _unescape_property(text: str) -> str:
    return _unescape_data(text.replace("%3A", ":").replace("%2C", ","))


def test_github_annotation_is_one_line_whatever_the_file_name_and_message():
    file = "catalog/gemm/we%ird\nname,v2:x.yaml"
    d = Diagnostic("SMEM-BUDGET", "100% of it\r\nand more", Location(file, 7, 5, "kernels[0].stages"),
                   "use stages <= 4", subject="gemm_sm90_x", facts={"smem_bytes": 1})
    (line,) = render([d], "github").splitlines()
    match = re.fullmatch(r"::error file=([^,:]*),line=7,col=5,title=([^,:]*)::(.*)", line)
    assert match, line
    assert _unescape_property(match.group(1)) == file
    assert _unescape_property(match.group(2)) == "SMEM-BUDGET (gemm_sm90_x)"
    assert _unescape_data(match.group(3)) == "100% of it\r\nand more Hint: use stages <= 4"
    warning = Diagnostic("SHADOWED", "x", Location("a.yaml"), severity=Severity.WARNING)
    assert render([warning], "github") == "::warning file=a.yaml,title=SHADOWED::x"


def test_json_facts_are_plain_data():
    d = Diagnostic("X", "m", Location("f.yaml", 1, 2), facts={"dtype": Severity.ERROR, "pair": (1, 2),
                                                                "nested": {"set": {3, 1}}, "other": object})
    (record,) = json.loads(render([d], "json"))
    assert record["facts"]["dtype"] == "error" and record["facts"]["pair"] == [1, 2]
    assert record["facts"]["nested"] == {"set": [1, 3]} and isinstance(record["facts"]["other"], str)
    assert record["location"] == {"file": "f.yaml", "line": 1, "column": 2, "path": None}


def test_diagnostics_pickle_with_every_field():
    d = Diagnostic("COMPILE-SMEM-DRIFT", "m", Location("f.yaml", 3, 5, "kernels[1]"), "h",
                   facts={"traced_bytes": 1, "model_bytes": 2}, subject="gemm_sm90_x")
    assert pickle.loads(pickle.dumps(d)) == d
    (again,) = pickle.loads(pickle.dumps(DiagnosticError([d]))).diagnostics
    assert again == d


def test_every_compile_stage_id_is_documented(root):
    text = (root / "docs" / "catalog.md").read_text()
    table = text.split("### Diagnostics from the build", 1)[1]
    assert [rule for rule in COMPILE_HINTS if f"| {rule} |" not in table] == [], "add these to docs/catalog.md"
    assert all(COMPILE_HINTS.values()), "every compile-stage id has a hint"
