"""The command line: formats, exit codes, a catalog with many mistakes, and the closest spelling of a typo."""

from __future__ import annotations

import json
import subprocess
import sys

import click
import pytest
from click.testing import CliRunner

from builder.cli import entry
from builder.cli.commands import main
from builder.compile.parallel import LocalExecutor
from builder.diagnostics import JSON_KEYS, LOCATION_KEYS, DiagnosticError
from builder.pipeline.build import BuildRequest, Selection, build
from tests.fixture_catalogs import FIXTURES, ROOT, expectations, make_project, overlays

BROKEN = ROOT / "tests" / "fixtures" / "broken_catalog"


def run(*args: str):
    return CliRunner().invoke(main, ["--root", str(ROOT), *args])


def test_broken_catalog_reports_every_mistake_at_its_line():
    result = run("validate", "--format", "json", str(BROKEN))
    assert result.exit_code == 1, result.output
    records = json.loads(result.stdout)
    assert isinstance(records, list) and records
    assert all(tuple(r) == JSON_KEYS and tuple(r["location"]) == LOCATION_KEYS for r in records), \
        "exactly {rule, severity, subject, message, hint, location: {file, line, column, path}, facts}"
    expected = {(e.file, e.line, e.rule) for e in expectations(*sorted((BROKEN / "gemm").glob("*.yaml")))}
    assert len({rule for _, _, rule in expected}) >= 15, "the fixture must hold at least 15 distinct mistakes"
    reported = {(r["location"]["file"].rsplit("/", 1)[-1], r["location"]["line"], r["rule"]) for r in records}
    assert expected - reported == set(), "mistakes not reported at their line"
    assert reported - expected == set(), "diagnostics at lines the fixture does not mark"
    assert all(r["message"] and r["hint"] and r["location"]["column"] for r in records)


def test_github_format_is_one_annotation_per_problem():
    result = run("validate", "--format", "github", str(BROKEN))
    assert result.exit_code == 1
    lines = [line for line in result.stdout.splitlines() if line]
    records = json.loads(run("validate", "--format", "json", str(BROKEN)).stdout)
    assert len(lines) == len(records)
    assert all(line.startswith(("::error file=", "::warning file=")) and ",line=" in line and ",title=" in line
               for line in lines)


def test_default_catalog_is_clean_and_exits_zero():
    result = run("validate")
    assert result.exit_code == 0, result.output
    assert "0 errors, 0 warnings" in result.stderr
    assert json.loads(run("validate", "--format", "json").stdout) == []


def test_usage_errors_exit_two():
    assert run("validate", "no/such/dir").exit_code == 2
    assert run("validate", "--format", "xml").exit_code == 2
    assert run("validate", "--explain", "gemm_sm100_nope").exit_code == 2


def test_explain_reports_derived_values():
    kid = "gemm_sm100_bf16_bf16_f32_bf16_tn_128x256x64_c2x1_2cta"
    result = run("validate", "--explain", kid)
    assert result.exit_code == 0, result.output
    summary = json.loads(result.stdout)
    assert summary["kernel"] == kid and summary["cta_group"] == 2
    assert summary["stages"] == summary["max_fitting_stages"] >= 2
    assert summary["smem_total_bytes"] <= summary["smem_budget_bytes"]
    assert summary["smem_per_stage_bytes"] == 2 * 128 * 64 * 2  # A 128x64 + half of B's 256 rows, bf16
    assert summary["tmem_columns_per_stage"] == 256 and summary["tmem_columns_allocated"] == 512
    assert summary["problems"] == []


def test_explain_works_for_a_kernel_no_template_serves(tmp_path):
    """A masked kernel of the sm103 pipeline in the TEMPLATE-SUPPORT fixture's project, whose overlay
    makes the pipeline's grouped template build the contiguous layout only."""
    variant = FIXTURES / "TEMPLATE-SUPPORT" / "fail-no-template.yaml"
    project = make_project(tmp_path, [variant], overlays(variant))
    result = CliRunner().invoke(main, ["--root", str(project), "validate", "--explain",
                                       "grouped_masked_sm103_e2m1_e2m1_f32_bf16_tn_128x128x768_c1x1_sfe8m0x32"])
    assert result.exit_code == 0, result.output
    summary = json.loads(result.stdout)
    assert summary["smem_model"].startswith("lower bound")
    assert {p["rule"] for p in summary["problems"]} == {"TEMPLATE-SUPPORT"}


def test_schema_is_written_atomically_and_describes_the_catalog(tmp_path):
    out = tmp_path / "catalog.schema.json"
    result = run("schema", "--out", str(out))
    assert result.exit_code == 0, result.output
    schema = json.loads(out.read_text())
    fields = schema["$defs"]["KernelItem"]["properties"]
    assert {"tile", "cluster", "cta_group", "block_scale", "stages", "sweep", "targets"} <= set(fields)
    assert schema["additionalProperties"] is False
    assert list(tmp_path.iterdir()) == [out], "no temporary files left behind"
    facts = json.loads(run("schema", "--of", "facts").stdout)
    assert "mma_k_bytes" in facts["$defs"]["FactsBody"]["properties"]


@pytest.mark.parametrize("args, suggestion", [
    (["validate", "--format", "jsn"], "'json'"),
    (["schema", "--of", "fact"], "'facts'"),
    (["list", "--format", "txt"], "'text'"),
    (["build", "--progress", "plian"], "'plain'"),
    (["build", "--executor", "rya"], "'ray'"),
])
def test_a_mistyped_choice_is_a_usage_error_naming_the_closest(args, suggestion):
    result = run(*args)
    assert result.exit_code == 2
    assert f"did you mean {suggestion}" in result.stderr.lower()


def test_an_unknown_explain_id_names_the_closest_id():
    result = run("validate", "--explain", "gemm_sm90_bf16_bf16_f32_bf16_tn_128x128x64_c1x3")
    assert result.exit_code == 2
    assert "did you mean 'gemm_sm90_bf16_bf16_f32_bf16_tn_128x128x64_c1x2'" in result.stderr


@pytest.mark.parametrize("selection, suggestion", [
    (Selection(arches=("sm90a",)), ["--arch sm_90a"]),
    (Selection(pipelines=("sm91",), arches=("sm_90a",)), ["--pipeline sm90"]),
    (Selection(only=("nothing*",)), []),
])
def test_an_empty_selection_names_the_closest_pipeline_and_target(selection, suggestion, tmp_path):
    request = BuildRequest(root=ROOT, out_dir=tmp_path, cache_dir=tmp_path / "cache", executor=LocalExecutor(1),
                           selection=selection)
    with pytest.raises(DiagnosticError) as info:
        build(request)
    (problem,) = info.value.diagnostics
    assert problem.rule == "BUILD-EMPTY" and problem.facts["did_you_mean"] == suggestion


@pytest.mark.parametrize("args", [
    ["validate", "no/such/dir"],
    ["validate", "catalog/gemm/no-such.yaml"],
    ["--root", "no/such/dir", "validate"],
    ["validate", "--root", "no/such/dir"],
    ["build", "--root", "no/such/dir"],
    ["list", "--root", "no/such/dir"],
    ["--root", str(ROOT), "package", "no/such/bundle"],
    ["inspect", "no/such/bundle"],
    ["diff", "no/such/old", "no/such/new"],
    ["merge", "no/such/shard"],
    ["tune", "no/such/bundle"],
])
def test_a_missing_path_is_a_usage_error(args, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 2, result.output


def test_root_may_follow_the_command(tmp_path, monkeypatch):
    """docs/catalog.md's `tilekiln validate --root DIR`, run from another directory."""
    monkeypatch.chdir(tmp_path)
    after = CliRunner().invoke(main, ["validate", "--root", str(ROOT), "--format", "json", str(BROKEN)])
    before = CliRunner().invoke(main, ["--root", str(ROOT), "validate", "--format", "json", str(BROKEN)])
    assert after.exit_code == before.exit_code == 1
    assert json.loads(after.stdout) == json.loads(before.stdout) != []
    both = CliRunner().invoke(main, ["--root", str(ROOT), "validate", "--root", str(ROOT)])
    assert both.exit_code == 0, both.output
    listed = CliRunner().invoke(main, ["list", "--root", str(ROOT), "--format", "json", "--cache", str(tmp_path)])
    assert listed.exit_code == 0 and json.loads(listed.stdout)


def test_two_different_roots_are_a_usage_error(tmp_path):
    result = CliRunner().invoke(main, ["--root", str(ROOT), "validate", "--root", str(tmp_path)])
    assert result.exit_code == 2


@pytest.mark.parametrize("argv, debug_env, traceback", [
    (["validate"], None, False),
    (["--debug", "validate"], None, True),
    (["validate"], "1", True),
    (["validate"], "0", False),
])
def test_an_internal_error_prints_its_traceback_only_when_asked(argv, debug_env, traceback, monkeypatch, capsys):
    def broken(*args, **kwargs):
        raise RuntimeError("deliberate")

    monkeypatch.setattr("builder.check.validate.validate_project", broken)
    monkeypatch.setattr(sys, "argv", ["tilekiln", "--root", str(ROOT), *argv])
    monkeypatch.delenv("TILEKILN_DEBUG", raising=False)
    if debug_env is not None:
        monkeypatch.setenv("TILEKILN_DEBUG", debug_env)
    with pytest.raises(SystemExit) as info:
        entry.main()
    assert info.value.code == 101
    err = capsys.readouterr().err
    assert "RuntimeError: deliberate" in err
    assert ("Traceback (most recent call last)" in err) is traceback
    assert ("rerun with --debug" in err) is not traceback


def test_the_readme_synopsis_names_every_option_of_every_command():
    text = (ROOT / "README.md").read_text()
    synopsis = text.split("## The command line", 1)[1].split("\n## ", 1)[0]
    commands = [("tilekiln", main), *main.commands.items()]
    missing = [f"{name} {p.opts[-1]}" for name, command in commands for p in command.params
               if isinstance(p, click.Option) and "--help" not in p.opts
               and not any(f"{opt} " in synopsis or f"{opt}]" in synopsis for opt in p.opts)]
    assert not missing, "add these to README's command-line synopsis"


def test_no_tracked_text_file_holds_a_merge_conflict_marker():
    """A merge left docs/runtime.md with its conflict markers once; git does not refuse the commit."""
    files = subprocess.run(["git", "ls-files", "*.md", "*.py", "*.j2", "*.yaml", "*.toml", "*.c", "Makefile"],
                           cwd=ROOT, capture_output=True, text=True, check=True).stdout.split()
    marked = [f"{name}:{number}" for name in files if (ROOT / name).is_file()
              for number, line in enumerate((ROOT / name).read_text(errors="replace").splitlines(), 1)
              if line.startswith(("<<<<<<< ", ">>>>>>> ")) or line == "======="]
    assert not marked, f"resolve the conflicts at {marked}"
