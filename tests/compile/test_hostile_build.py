"""A build whose catalog file name and fact sources hold shell, Jinja and Python fragments:
the text is free to hold them, the build writes only its output and cache directories, and
no fragment reaches a rendered source, the library or a command (nothing runs them)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import yaml

from tests.compile.conftest import run_build

pytestmark = pytest.mark.compile

FRAGMENTS = ('"); import os; os.system("touch PWNED") #', "{{ 'PWNED' ~ 7*7 }}", "{% include 'x' %}PWNED",
             "$(touch PWNED)", "`touch PWNED`", "../../../PWNED")


def tree(base: Path) -> dict[str, bytes | None]:
    return {str(p.relative_to(base)): (p.read_bytes() if p.is_file() else None) for p in sorted(base.rglob("*"))}


def test_free_text_with_code_fragments_builds_and_writes_only_the_output(small_build, tmp_path):
    base = small_build.path.parent.parent  # <base>/{project,artifacts,cache} of tests/compile/conftest.py
    project = tmp_path / "project"
    shutil.copytree(base / "project", project)
    shutil.copytree(base / "cache", tmp_path / "cache")
    (project / "catalog" / "gemm" / "sm90.yaml").rename(project / "catalog" / "gemm" / f"{FRAGMENTS[3]}.yaml")
    facts = project / "catalog" / "hardware" / "sm90.yaml"
    data = yaml.safe_load(facts.read_text())
    data["description"] = "\n".join(FRAGMENTS)
    for i, fact in enumerate(data["facts"].values()):
        fact["source"] = FRAGMENTS[i % len(FRAGMENTS)]
    facts.write_text(yaml.safe_dump(data, sort_keys=False, allow_unicode=True))
    before = tree(tmp_path)

    result = run_build(project, tmp_path / "out", tmp_path / "cache")

    assert result.ok, [r.error for b in result.bundles for r in b.failed]
    after = tree(tmp_path)
    outside = {p for p in before.keys() | after.keys() if not p.startswith(("out", "cache"))}
    assert {p: after.get(p) for p in outside} == {p: before.get(p) for p in outside}
    assert not list(tmp_path.rglob("PWNED")) and not Path("PWNED").exists()
    bundle = tmp_path / "out" / "sm90a"
    for path in bundle.rglob("*"):
        if path.is_file() and path.name != "manifest.json":  # the manifest records the catalog file's name
            assert b"PWNED" not in path.read_bytes(), path
