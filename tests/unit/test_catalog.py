"""Catalog loading: the default catalog, sweep expansion and located YAML errors."""

from __future__ import annotations

from pathlib import Path

import pytest

from builder.catalog import load_catalog
from builder.diagnostics import DiagnosticError
from builder.naming import parse_kernel_id
from builder.validate import Project, validate_project


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
    (HEADER + "  - tile: [128, 128, 64]\n    cluster: [1, 1\n", "YAML-SYNTAX", 9),
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
