"""Run the validator on a fixture catalog and read what a fixture expects.

A fixture directory ``tests/fixtures/catalog/<RULE>/`` holds ``fail*.yaml``
and ``pass*.yaml`` catalog files and, optionally, ``overlay/`` (copied over a
scratch copy of the project for every variant: extra hardware facts,
template manifests) and ``fail-overlay/`` (for the failing variants only:
broken facts or manifests). A line that a diagnostic must point at ends in
``# expect: RULE[, RULE...]``, in a catalog file or an overlay file.
"""

from __future__ import annotations

import re
import shutil
from dataclasses import dataclass
from pathlib import Path

from builder.check.validate import Project, validate_project
from builder.diagnostics import Diagnostic

ROOT = Path(__file__).resolve().parent.parent
FIXTURES = ROOT / "tests" / "fixtures" / "catalog"
_EXPECT = re.compile(r"#\s*expect:\s*([A-Z0-9-]+(?:\s*,\s*[A-Z0-9-]+)*)")


@dataclass(frozen=True)
class Expected:
    file: str  # base name
    line: int
    rule: str


def expectations(*paths: Path) -> set[Expected]:
    out = set()
    for path in paths:
        # Replacement characters: a YAML-ENCODING fixture is not UTF-8 on purpose.
        for number, text in enumerate(path.read_bytes().decode("utf-8", "replace").splitlines(), start=1):
            match = _EXPECT.search(text)
            if match:
                out |= {Expected(path.name, number, r.strip()) for r in match.group(1).split(",")}
    return out


def overlays(variant: Path) -> list[Path]:
    names = ["overlay"] + (["fail-overlay"] if variant.name.startswith("fail") else [])
    return [variant.parent / n for n in names if (variant.parent / n).is_dir()]


def overlay_files(variant: Path) -> list[Path]:
    return sorted(p for overlay in overlays(variant) for p in overlay.rglob("*.yaml"))


def make_project(base: Path, catalog_files: list[Path], extra: list[Path] = ()) -> Path:
    """A scratch project: catalog/ and templates/ of the repository, the given
    files as the only catalog/gemm/*.yaml, then each ``extra`` tree copied on top.
    The repository's verification records (catalog/verification/) are left out: they
    name the repository's own cubins, which would mark a scratch build's identical
    kernels hardware-verified; the tests that want a record write one."""
    for name in ("catalog", "templates"):
        shutil.copytree(ROOT / name, base / name, ignore=shutil.ignore_patterns("verification"))
    for old in (base / "catalog" / "gemm").glob("*.yaml"):
        old.unlink()
    for path in catalog_files:
        shutil.copy(path, base / "catalog" / "gemm" / path.name)
    for tree in extra:
        shutil.copytree(tree, base, dirs_exist_ok=True)
    return base


def validate_fixture(base: Path, variant: Path) -> tuple[Diagnostic, ...]:
    project = make_project(base, [variant], overlays(variant))
    return validate_project(Project(project)).diagnostics


def found(diagnostics, rule: str) -> set[tuple[str, int]]:
    return {(Path(d.location.file).name, d.location.line) for d in diagnostics if d.rule == rule}
