"""Catalog loading: the default catalog, sweep expansion, located YAML errors, spelling hints and strict types."""

from __future__ import annotations

import copy
import functools
from pathlib import Path

import pytest
from pydantic import ValidationError

from builder.check.validate import Project, validate_project
from builder.diagnostics import DiagnosticError
from builder.load.catalog import CatalogFile, load_catalog, parse_size
from builder.load.facts import FactsFile
from builder.load.pydantic_errors import diagnostics_from_validation
from builder.load.templates import TemplateManifest
from builder.load.yamlsrc import format_path, load_yaml
from tilekiln.spec import parse_kernel_id


def test_default_catalog_validates_clean(root):
    result = validate_project(Project(root))
    assert result.ok, [d.to_text() for d in result.diagnostics]
    assert len(result.kernels) >= 8
    dtypes = {k.entry.config.dtypes.a.value for k in result.kernels}
    assert {"bf16", "f16"} <= dtypes
    assert len({k.entry.config.tile for k in result.kernels}) >= 3
    assert len({k.entry.config.cluster for k in result.kernels}) >= 2
    blackwell = [k for k in result.kernels if k.entry.config.pipeline == "sm100"]
    assert {k.entry.config.cta_group for k in blackwell} == {1, 2}
    assert {"sm_100a", "sm_100f", "sm_103a", "sm_107a"} <= {t for k in blackwell for t in k.entry.targets}
    assert not result.diagnostics, [d.to_text() for d in result.diagnostics]


def test_default_catalog_ids_round_trip(root):
    for entry in load_catalog(root / "catalog", root).entries:
        assert parse_kernel_id(entry.kernel_id) == entry.config


def _write(project: Path, body: str) -> Path:
    path = project / "catalog" / "gemm" / "sm90.yaml"
    path.write_text(body)
    return path


HEADER = """pipeline: sm90
targets: [sm_90a]
defaults:
  dtypes: {a: bf16, b: bf16, acc: f32, c: bf16}
  layout: tn
kernels:
"""


def test_sweep_is_a_cartesian_product(project_copy):
    _write(project_copy, HEADER + """  - sweep:
      tile: [[128, 128, 64], [128, 256, 64]]
      cluster: [[1, 1], [2, 1], [1, 2]]
""")
    cat = load_catalog(project_copy / "catalog", project_copy)
    entries = [e for e in cat.entries if e.file.endswith("sm90.yaml")]
    assert len(entries) == 6
    assert len({e.kernel_id for e in entries}) == 6
    # each expanded entry points at the sweep value it came from
    entry = [e for e in entries if e.config.cluster.n == 2 and e.config.tile.n == 256][0]
    assert entry.locate("cluster").line == 9 and entry.locate("tile").line == 8


@pytest.mark.parametrize("body, rule, line", [
    # an unclosed bracket: the line it opens on, not the end of the file where the parser noticed
    (HEADER + "  - tile: [128, 128, 64]\n    cluster: [1, 1\n", "YAML-SYNTAX", 8),
    (HEADER + "  - tile: [128, 128, 64]\n    tile: [64, 64, 64]\n    cluster: [1, 1]\n", "YAML-DUPLICATE-KEY", 8),
    (HEADER + "  - tile: [128, 128, 64]\n    clutser: [1, 1]\n", "CATALOG-SCHEMA", 8),
    (HEADER + "  - tile: [128, big, 64]\n    cluster: [1, 1]\n", "CATALOG-SCHEMA", 7),
    (HEADER + "  - tile: [128, 128, 64]\n", "CATALOG-INCOMPLETE", 7),
    (HEADER + "  - tile: [128, 128, 64]\n    cluster: [1, 1]\n    layout: tx\n", "CATALOG-SCHEMA", 9),
])
def test_yaml_errors_are_located(project_copy, body, rule, line):
    _write(project_copy, body)
    with pytest.raises(DiagnosticError) as info:
        load_catalog(project_copy / "catalog", project_copy)
    found = [(d.rule, d.location.line) for d in info.value.diagnostics]
    assert (rule, line) in found, found
    assert all(d.location.file.endswith("sm90.yaml") for d in info.value.diagnostics)


def _problems(project: Path) -> list:
    with pytest.raises(DiagnosticError) as info:
        load_catalog(project / "catalog", project)
    return info.value.diagnostics


@pytest.mark.parametrize("body, line, suggestion", [
    (HEADER.replace("pipeline:", "pipelin:") + "  - {tile: [128, 128, 64], cluster: [1, 1]}\n", 1, "pipeline"),
    (HEADER.replace("  layout: tn", "  layuot: tn") + "  - {tile: [128, 128, 64], cluster: [1, 1]}\n",
     5, "layout"),
    (HEADER.replace("acc: f32", "accum: f32") + "  - {tile: [128, 128, 64], cluster: [1, 1]}\n", 4, "acc"),
    (HEADER + "  - tile: [128, 128, 64]\n    clustr: [1, 1]\n", 8, "cluster"),
    (HEADER + "  - tile: [128, 128, 64]\n    sweep:\n      clustr: [[1, 1]]\n", 9, "cluster"),
    (HEADER + "  - tile: [128, 128, 64]\n    cluster: [1, 1]\n    target: [sm_90a]\n", 9, "targets"),
    (HEADER + "  - tile: [128, 128, 64]\n    cluster: [1, 1]\n    block_scale: {scale: e4m3, blok: 16}\n",
     9, "block"),
    (HEADER.replace("a: bf16", "a: bf61") + "  - {tile: [128, 128, 64], cluster: [1, 1]}\n", 4, "bf16"),
    (HEADER + "  - tile: [128, 128, 64]\n    cluster: [1, 1]\n    dtypes: {a: bf16, b: bf16, acc: fp32, c: bf16}\n",
     9, "f32"),
    (HEADER + "  - tile: [128, 128, 64]\n    cluster: [1, 1]\n    layout: TN\n", 9, "tn"),
    (HEADER + "  - tile: [128, 128, 64]\n    cluster: [1, 1]\n    schedule: ping-pong\n", 9, "pingpong"),
    (HEADER + "  - tile: [128, 128, 64]\n    cluster: [1, 1]\n    raster: M\n", 9, "m"),
    (HEADER + "  - tile: [128, 128, 64]\n    cluster: [1, 1]\n    evict_first: [A]\n", 9, "a"),
    (HEADER + "  - tile: [128, 128, 64]\n    cluster: [1, 1]\n    stages: atuo\n", 9, "auto"),
    (HEADER + "  - tile: [128, 128, 64]\n    cluster: [1, 1]\n    block_scale: {scale: e8m1, block: 32}\n",
     9, "e8m0"),
    (HEADER + "  - tile: [128, 128, 64]\n    sweep:\n      cluster: [[1, 1]]\n      layout: [tn, ttt]\n",
     10, "tt"),
])
def test_a_misspelt_key_or_value_gets_the_closest_spelling_in_its_hint(project_copy, body, line, suggestion):
    _write(project_copy, body)
    # A misspelt required key also leaves the key missing: that problem has nothing to suggest.
    (problem,) = [d for d in _problems(project_copy) if "did_you_mean" in d.facts]
    assert (problem.rule, problem.location.line) == ("CATALOG-SCHEMA", line), problem.to_text()
    assert problem.facts["did_you_mean"] == suggestion and repr(suggestion) in problem.hint


def test_nothing_close_is_no_suggestion(project_copy):
    _write(project_copy, HEADER + "  - tile: [128, 128, 64]\n    cluster: [1, 1]\n    xyzzy: 1\n    layout: tx\n")
    problems = _problems(project_copy)
    assert sorted((d.rule, d.location.line) for d in problems) == [("CATALOG-SCHEMA", 9), ("CATALOG-SCHEMA", 10)]
    assert not any("did_you_mean" in d.facts for d in problems)


@pytest.mark.parametrize("body, rule, suggestion", [
    (HEADER.replace("pipeline: sm90", "pipeline: sm91") + "  - {tile: [128, 128, 64], cluster: [1, 1]}\n",
     "UNKNOWN-PIPELINE", "sm90"),
    (HEADER.replace("[sm_90a]", "[sm_90]") + "  - {tile: [128, 128, 64], cluster: [1, 1]}\n", "TARGET-ARCH", "sm_90a"),
])
def test_an_unknown_pipeline_or_target_gets_the_closest_one(project_copy, body, rule, suggestion):
    _write(project_copy, body)
    found = [d for d in validate_project(Project(project_copy)).diagnostics if d.rule == rule]
    assert found and all(d.facts["did_you_mean"] == suggestion and d.location.line in (1, 2) for d in found)


@pytest.mark.parametrize("settings, line", [
    ("version: ０.1.0\nglibc: '2.28'\n", 1),           # full-width digit zero
    ("version: 0.١.0\nglibc: '2.28'\n", 1),           # Arabic-Indic digit one
    ("version: 0.1.0\nwheel_size_limit: １00MB\nglibc: '2.28'\n", 2),
    ("version: 0.1.0\nglibc: '2.２8'\n", 2),
])
def test_versions_and_sizes_take_ascii_digits_only(project_copy, settings, line):
    (project_copy / "catalog" / "catalog.yaml").write_text(settings)
    assert [(d.rule, d.location.line) for d in _problems(project_copy)] == [("CATALOG-SCHEMA", line)]


def test_a_size_on_the_command_line_takes_ascii_digits_only():
    assert parse_size("100MB") == 100 * 10**6
    with pytest.raises(ValueError):
        parse_size("１００MB")


def _scalars(node, path=()):
    """(path, value) of every integer and boolean in a YAML document's data, mapping keys aside."""
    if isinstance(node, dict):
        for key, value in node.items():
            yield from _scalars(value, path + (key,))
    elif isinstance(node, list):
        for i, value in enumerate(node):
            yield from _scalars(value, path + (i,))
    elif isinstance(node, (bool, int)):
        yield path, node


@pytest.mark.parametrize("pattern, model", [("catalog/gemm/*.yaml", CatalogFile),
                                            ("catalog/hardware/*.yaml", FactsFile),
                                            ("templates/*.yaml", TemplateManifest)])
def test_every_number_and_boolean_of_the_shipped_files_is_refused_quoted(root, pattern, model):
    """The JSON Schema says integer or boolean for each; quoted, each is a schema error at its own path."""
    for path in sorted(root.glob(pattern)):
        doc = load_yaml(path)
        scalars = list(_scalars(doc.data))
        assert scalars, path
        for where, value in scalars:
            data = copy.deepcopy(doc.data)
            parent = functools.reduce(lambda node, part: node[part], where[:-1], data)
            parent[where[-1]] = str(value).lower()
            with pytest.raises(ValidationError) as info:
                model.model_validate(data)
            located = {d.location.path for d in diagnostics_from_validation(info.value, doc, "X", model)}
            assert format_path(where) in located, (path.name, where, located)


def test_block_scaled_configs_have_their_own_template():
    """On sm100 two templates implement gemm: a config with block_scale is sm100_blockscaled's, one
    without sm100_gemm's, so neither is ambiguous (TEMPLATE-AMBIGUOUS)."""
    from builder.load.templates import load_templates
    from tests.fixture_catalogs import ROOT

    templates = load_templates(ROOT / "templates")
    assert [t.name for t in templates.serving("sm100", "gemm")] == ["sm100_gemm"]
    assert [t.name for t in templates.serving("sm100", "gemm", block_scaled=True)] == ["sm100_blockscaled"]
    assert templates.serving("sm90", "gemm", block_scaled=True) == ()
