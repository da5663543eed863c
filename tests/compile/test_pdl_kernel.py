"""Programmatic dependent launch: the SASS waits on the predecessor (ACQBULK, PTX
griddepcontrol.wait) before any global-memory access and signals its dependents
(PREEXIT, griddepcontrol.launch_dependents) once per role."""

from __future__ import annotations

import json
import re

import pytest

from builder.compile.cubin import disassemble
from tests.compile.conftest import make_project, run_build, sm90_catalog

pytestmark = pytest.mark.compile

# Cooperative and ping-pong, multicast, and an fp8 kernel, whose epilogue reads
# the scales with plain global loads.
CATALOG = sm90_catalog("""\
  - tile: [128, 128, 64]
    cluster: [2, 1]
  - tile: [64, 128, 64]
    cluster: [1, 1]
    schedule: pingpong
  - tile: [128, 128, 128]
    cluster: [1, 1]
    dtypes: {a: e4m3, b: e4m3, acc: f32, c: bf16}
""", dtypes="{a: bf16, b: bf16, acc: f32, c: bf16}", layout="tn")

# Every instruction that reads or writes global memory: TMA, plain, atomics, reductions.
_GLOBAL_RE = re.compile(r"\b(UTMALDG|UTMASTG|UTMAREDG|UBLKCP|LDG|STG|ATOMG|REDG|RED|ATOM)\b")
_ADDRESS_RE = re.compile(r"/\*([0-9a-f]{4,})\*/\s+(.*)")


def instructions(sass: str) -> list[tuple[int, str]]:
    return [(int(m.group(1), 16), m.group(2)) for m in _ADDRESS_RE.finditer(sass)]


def test_every_global_access_follows_the_grid_dependency_wait(tmp_path):
    project = make_project(tmp_path / "project", CATALOG)
    result = run_build(project, tmp_path / "artifacts", tmp_path / "cache", jobs=2)
    assert result.ok, [r.error for b in result.bundles for r in b.failed]
    bundle = result.bundles[0].path
    kernels = json.loads((bundle / "manifest.json").read_text())["kernels"]
    assert len(kernels) == 3
    cubins = {r.kernel_id: r.cubin for r in result.bundles[0].records}
    for kernel in kernels:
        code = instructions(disassemble(cubins[kernel["id"]]))
        waits = [addr for addr, text in code if text.startswith("ACQBULK")]
        accesses = [(addr, text) for addr, text in code if _GLOBAL_RE.search(text)]
        exits = [addr for addr, text in code if re.search(r"\bEXIT\b", text) and "PREEXIT" not in text]
        assert len(waits) == 1, (kernel["id"], waits)
        # The wait sits in the code every thread runs, before any role branches off to exit.
        assert waits[0] < min(exits), kernel["id"]
        assert accesses and all(addr > waits[0] for addr, _ in accesses), (kernel["id"], accesses[:3])
        if kernel["config"]["dtypes"]["a"] == "e4m3":
            assert any(text.startswith("LDG") for _, text in accesses), "the scale reads should be plain loads"
        # One signal per role: the producer after its loads, the consumers after their stores.
        assert sum(text.startswith("PREEXIT") for _, text in code) == 2, kernel["id"]
