"""Fuzzed catalogs: random and mutated files end in success or located diagnostics, in bounded time.

Strategies: byte and token mutations of valid catalogs (YAML syntax), typed
values replaced by values of every other type, range and size (wrong types,
out-of-range numbers, code fragments), re-encodings and injected bytes,
deep nesting, alias bombs and oversized documents. Every example is loaded
and checked as ``validate`` does, against facts and templates loaded once,
and must end in a catalog or in diagnostics that each name the file, and a
line unless they concern the file as a whole; a few go through the command
line, which must exit 0 or 1 (never 101, an internal error).

``make test`` runs a small reproducible sample per property. A longer
campaign with fresh random examples (5,000 per property, about an hour):

    .venv/bin/python -m pytest tests/unit/test_fuzz_catalog.py -p no:cacheprovider \\
        --hypothesis-profile=fuzz-campaign --hypothesis-show-statistics

(the profile is registered in tests/conftest.py).
"""

from __future__ import annotations

import json
import shutil
import time
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from builder.check.validate import check_catalog
from builder.cli.commands import main as cli
from builder.diagnostics import Diagnostic, DiagnosticError, Severity
from builder.load.catalog import load_catalog
from builder.load.facts import FactTable, load_facts
from builder.load.templates import TemplateSet, load_templates
from builder.load.tuning import read_tuning
from builder.load.verification import read_verification
from builder.load.yamlmodel import MAX_COUNT
from tests.fixture_catalogs import make_project
from tilekiln.spec import DTYPES, LAYOUT_CODES, Activation, Raster, Schedule

SEEDS = ("""pipeline: sm90
targets: [sm_90a]
defaults:
  dtypes: {a: bf16, b: bf16, acc: f32, c: bf16}
  layout: tn
  stages: auto
kernels:
  - tile: [128, 128, 64]
    cluster: [1, 1]
  - tile: [64, 128, 64]
    sweep:
      cluster: [[1, 2], [2, 1]]
    swap_ab: false
    targets: [sm_90a]
  - {tile: [64, 256, 64], cluster: [2, 1], schedule: pingpong, activation: silu, evict_first: [b], swizzle: 8}
""", """pipeline: sm100
targets: [sm_100a, sm_100f]
defaults:
  dtypes: {a: e4m3, b: e4m3, acc: f32, c: bf16}
  layout: tn
kernels:
  - {tile: [128, 256, 128], cluster: [2, 1], cta_group: 2, raster: n, swizzle: 4}
  - tile: [128, 128, 128]
    cluster: [1, 1]
    stages: 4
""")
REPO = Path(__file__).resolve().parents[2]
TARGETS = ["sm_90a", "sm_100a", "sm_100f", "sm_103a", "sm_103f", "sm_107a"]
# Diagnostics about a file as a whole, which have no line.
FILE_LEVEL = {"YAML-IO", "CATALOG-SETTINGS"}
TIME_BOUND_S = 5
CAMPAIGN = settings.default is settings.get_profile("fuzz-campaign")
FUZZ = settings(max_examples=settings.default.max_examples if CAMPAIGN else 40, derandomize=not CAMPAIGN,
                deadline=TIME_BOUND_S * 1000, database=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture,
                                       HealthCheck.data_too_large, HealthCheck.large_base_example])
TOKENS = (":", ": ", '"', '": ', "[]", "{}", "NaN", "1e400", '"\\u0000"', "-", "- ", "[", "]", "{", "}", ",", "&a ", "*a", "!!python/name:os.system ", "!x ", "'", '"',
          "#", "|", ">", "? ", "\t", "\n", "  ", "<<: ", "---\n", "...\n", "%YAML 1.1\n", "\\", "\x00", "\ufeff",
          "\u2028", "\x85", "~", "null", "true", "1e999", "0x1f", "-0", "9" * 80, "{{ 7*7 }}", "$(id)", "../")
SCALARS = st.one_of(
    st.integers(min_value=-(2**70), max_value=2**70), st.sampled_from([0, 1, 2, 64, 128, 255, 256, 2**16, 2**31]),
    st.floats(allow_nan=True, allow_infinity=True), st.booleans(), st.none(),
    st.text(max_size=40), st.sampled_from(["auto", "tn", "bf16", "sm_90a", "sm90", "gemm", "a", "b", "n", "m",
                                           "pingpong", "silu", "e8m0", "{{ x }}", "$(id)", "../../x", "/etc/x"]))
VALUES = st.recursive(SCALARS, lambda inner: st.one_of(st.lists(inner, max_size=4),
                                                       st.dictionaries(st.text(max_size=12), inner, max_size=4)),
                      max_leaves=12)


@dataclass(frozen=True)
class World:
    """A scratch project and its facts and templates, loaded once as validate loads them."""

    root: Path
    facts: FactTable
    templates: TemplateSet

    def __repr__(self) -> str:  # hypothesis prints it with every failing example
        return f"World({self.root})"


@pytest.fixture(scope="module")
def world(tmp_path_factory) -> World:
    root = make_project(tmp_path_factory.mktemp("fuzz"), [])
    shutil.rmtree(root / "catalog" / "tuning")
    return World(root, load_facts(root / "catalog" / "hardware", root), load_templates(root / "templates", root))


def check(world: World, data: bytes) -> tuple[Diagnostic, ...]:
    """Load and check ``data`` as catalog/gemm/fuzz.yaml; assert the outcome is well-formed and prompt."""
    root, facts, templates = world.root, world.facts, world.templates
    path = root / "catalog" / "gemm" / "fuzz.yaml"
    path.write_bytes(data)
    started = time.monotonic()
    try:
        catalog = load_catalog(root / "catalog", root, [path])
        diagnostics = tuple(check_catalog(catalog, facts, templates)[2])
    except DiagnosticError as exc:
        diagnostics = exc.diagnostics
    assert time.monotonic() - started < TIME_BOUND_S
    for d in diagnostics:
        assert isinstance(d, Diagnostic) and d.rule and d.message and d.location.file, d
        if d.location.file == "catalog/gemm/fuzz.yaml" and d.rule not in FILE_LEVEL:
            assert d.location.line is not None or "limit_bytes" in d.facts, d.to_text()
    event(" ".join(sorted({d.rule for d in diagnostics if d.severity is Severity.ERROR})) or "no error")
    return diagnostics


@st.composite
def mutated(draw, base: str | None = None) -> str:
    """A seed (or ``base``) with a few tokens inserted, characters deleted or lines duplicated, moved or cut."""
    text = base if base is not None else draw(st.sampled_from(SEEDS))
    for _ in range(draw(st.integers(1, 6))):
        at = draw(st.integers(0, len(text)))
        op = draw(st.sampled_from(["insert", "delete", "line", "truncate", "text"]))
        if op == "insert":
            text = text[:at] + draw(st.sampled_from(TOKENS)) + text[at:]
        elif op == "delete":
            text = text[:at] + text[at + draw(st.integers(1, 8)):]
        elif op == "line":
            lines = text.split("\n")
            i, j = draw(st.integers(0, len(lines) - 1)), draw(st.integers(0, len(lines) - 1))
            lines.insert(j, lines[i])
            text = "\n".join(lines)
        elif op == "truncate":
            text = text[:at]
        else:
            text = text[:at] + draw(st.text(max_size=20)) + text[at:]
    return text


@st.composite
def retyped(draw) -> str:
    """A seed whose values at a few paths are replaced by values of any type, range or size."""
    data = yaml.safe_load(draw(st.sampled_from(SEEDS)))
    for _ in range(draw(st.integers(1, 4))):
        parent, key = None, None
        node = data
        while isinstance(node, (dict, list)) and node and (parent is None or draw(st.booleans())):
            parent, key = node, draw(st.sampled_from(list(node) if isinstance(node, dict) else range(len(node))))
            node = parent[key]
        if parent is not None:
            parent[key] = draw(VALUES)
    return yaml.safe_dump(data, sort_keys=False, allow_unicode=True)


COUNT = st.one_of(st.sampled_from([1, 2, 3, 4, 8, 16, 32, 48, 64, 96, 128, 192, 256, 384, 512, 1024]),
                  st.integers(1, MAX_COUNT))


@st.composite
def ranged(draw) -> str:
    """A catalog of schema-valid values in any range: whatever the rules compute from them."""
    pipeline = draw(st.sampled_from(["sm90", "sm100", "sm103", "sm107"]))
    dtype = st.sampled_from(sorted(DTYPES))
    item = {"tile": [draw(COUNT) for _ in range(3)], "cluster": [draw(COUNT) for _ in range(2)]}
    optional = {
        "dtypes": st.fixed_dictionaries({k: dtype for k in "a b acc c".split()}),
        "layout": st.sampled_from(LAYOUT_CODES), "stages": st.one_of(st.just("auto"), COUNT),
        "cta_group": COUNT, "swizzle": COUNT, "swap_ab": st.booleans(),
        "schedule": st.sampled_from([x.value for x in Schedule]),
        "activation": st.sampled_from([x.value for x in Activation]),
        "raster": st.sampled_from([x.value for x in Raster]),
        "evict_first": st.lists(st.sampled_from(["a", "b"]), unique=True),
        "block_scale": st.fixed_dictionaries({"scale": dtype, "block": COUNT}),
    }
    for key in draw(st.lists(st.sampled_from(sorted(optional)), unique=True)):
        item[key] = draw(optional[key])
    catalog = {"pipeline": pipeline, "targets": draw(st.lists(st.sampled_from(TARGETS), min_size=1, unique=True)),
               "defaults": {"dtypes": {"a": "bf16", "b": "bf16", "acc": "f32", "c": "bf16"}, "layout": "tn"},
               "kernels": [item]}
    return yaml.safe_dump(catalog, sort_keys=False)


@given(st.one_of(mutated(), retyped(), ranged()))
@settings(FUZZ)
def test_mutated_and_retyped_catalogs_end_in_a_catalog_or_located_diagnostics(world, text):
    check(world, text.encode("utf-8", "surrogatepass"))


@given(st.one_of(mutated(), st.sampled_from(SEEDS)),
       st.sampled_from(["utf-8-sig", "utf-16", "utf-16-be", "utf-32", "latin-1", "cp1252", "bytes"]),
       st.binary(max_size=16), st.integers(min_value=0))
@settings(FUZZ)
def test_re_encoded_catalogs_and_injected_bytes_are_located(world, text, encoding, junk, where):
    text = text.replace("bf16", "bf16 # Schlüssel")
    if encoding == "bytes":
        data = text.encode("utf-8", "surrogatepass")
        at = where % (len(data) + 1)
        data = data[:at] + junk + data[at:]
    else:
        data = text.encode(encoding, "replace")
    check(world, data)


@given(st.sampled_from(SEEDS), st.integers(1, 20_000), st.sampled_from(["[", "{", "- ", "a: ", "&x [", "block"]))
@settings(FUZZ)
def test_deep_nesting_ends_in_a_located_limit_or_a_catalog(world, seed, depth, opener):
    if opener == "block":
        nested = "".join("  " * (i + 3) + f"k{i}:\n" for i in range(min(depth, 400)))
        text = seed.replace("    cluster: [1, 1]\n", "    cluster: [1, 1]\n    deep:\n" + nested, 1)
    else:
        closer = {"[": "]", "{": "}", "- ": "", "a: ": "", "&x [": "]"}[opener]
        body = opener * depth + "1" + closer * depth if closer else opener * min(depth, 2000) + "1"
        text = seed.replace("[1, 1]", body, 1) if opener in ("[", "{", "&x [") else seed + "    deep: " + body + "\n"
    check(world, text.encode())


@given(st.sampled_from(SEEDS), st.integers(2, 40), st.integers(1, 12), st.integers(0, 3))
@settings(FUZZ)
def test_alias_bombs_and_huge_documents_end_in_a_located_limit_or_a_catalog(world, seed, fanout, levels, copies):
    lines = [f"    l0: &l0 [{', '.join(['x'] * fanout)}]"]
    lines += [f"    l{i}: &l{i} [{', '.join([f'*l{i - 1}'] * fanout)}]" for i in range(1, levels)]
    items = seed.split("kernels:\n", 1)[1] * (8 ** copies)  # up to 4096 copies: over the size bound
    check(world, (seed + "\n".join(lines) + "\n" + items).encode())


KID = "gemm_sm90_bf16_bf16_f32_bf16_tn_128x128x64_c1x1"
TABLES = {
    "tuning": json.dumps({"device": "NVIDIA H200", "compute_capability": [9, 0], "sm_count": 132, "memory_mib": 143156,
                          "table": {"bf16/bf16->bf16:tn:4096x4096x4096:1": KID},
                          "measurements": {"bf16/bf16->bf16:tn:4096x4096x4096:1": {
                              "candidates": {KID: 0.5}, "flops": 2 ** 37, "shape": [4096, 4096, 4096],
                              "tflops": 274.9}}}, indent=2),
    "verification": json.dumps({"schema": 1, "bundle": "sm90a", "records": [{
        "sku": "H200", "device": "NVIDIA H200", "compute_capability": [9, 0], "driver": "580.65.06",
        "torch": "2.13.0", "date": "2026-01-01", "seed": 1, "bundle_version": "0.2.0",
        "kernels": {KID: {"cubin_sha256": "0" * 64, "max_rel_error": 0.001, "runs": 3}}, "failed": []}]}, indent=2),
}


def load_other(world: World, kind: str, data: bytes) -> None:
    """Load ``data`` as a facts file, a template manifest, a tuning table or a verification file."""
    root = world.root
    if kind == "facts":
        (root / "facts").mkdir(exist_ok=True)
        (root / "facts" / "sm90.yaml").write_bytes(data)
        load_facts(root / "facts", root)
    elif kind == "template":
        (root / "templates" / "sm90_gemm.yaml").write_bytes(data)
        load_templates(root / "templates", root)
    elif kind == "tuning":
        (root / "catalog" / "tuning" / "sm90a").mkdir(parents=True, exist_ok=True)
        (root / "catalog" / "tuning" / "sm90a" / "h200.json").write_bytes(data)
        read_tuning(root, "sm90a")
    else:
        (root / "catalog" / "verification").mkdir(exist_ok=True)
        (root / "catalog" / "verification" / "sm90a.json").write_bytes(data)
        read_verification(root, "sm90a")


@given(st.sampled_from(["facts", "template", "tuning", "verification"]), st.data())
@settings(FUZZ)
def test_mutated_facts_templates_and_committed_tables_end_in_located_diagnostics(world, kind, data):
    original = {"facts": REPO / "catalog" / "hardware" / "sm90.yaml",
                "template": REPO / "templates" / "sm90_gemm.yaml"}
    text = original[kind].read_text() if kind in original else TABLES[kind]
    text = data.draw(mutated(text))
    started = time.monotonic()
    try:
        load_other(world, kind, text.encode("utf-8", "surrogatepass"))
        event(f"{kind}: no error")
    except DiagnosticError as exc:
        event(f"{kind}: {' '.join(sorted({d.rule for d in exc.diagnostics}))}")
        for d in exc.diagnostics:
            assert d.rule and d.message and d.location.file, d
            assert d.location.line is not None or d.rule in FILE_LEVEL or "limit_bytes" in d.facts, d.to_text()
    finally:
        (world.root / "templates" / "sm90_gemm.yaml").write_bytes(original["template"].read_bytes())
    assert time.monotonic() - started < TIME_BOUND_S


@given(st.one_of(mutated(), retyped()))
@settings(FUZZ, max_examples=FUZZ.max_examples // 4)
def test_validate_on_the_command_line_exits_0_or_1(world, text):
    path = world.root / "catalog" / "gemm" / "fuzz.yaml"
    path.write_bytes(text.encode("utf-8", "surrogatepass"))
    result = CliRunner().invoke(cli, ["--root", str(world.root), "validate", "--format", "json", str(path)])
    assert result.exit_code in (0, 1), result.output
    assert result.exception is None or isinstance(result.exception, SystemExit), result.exception


def test_a_block_wider_than_one_mmas_k_is_a_diagnostic_not_a_crash(world):
    """Found by the fuzz above: an 8-bit tcgen05 MMA's 32 bytes of K hold no 64-element scale block,
    and planning its scale-factor columns divided by the blocks per MMA (0)."""
    catalog = {"pipeline": "sm100", "targets": ["sm_100a"],
               "defaults": {"dtypes": {"a": "e4m3", "b": "e4m3", "acc": "f32", "c": "bf16"}, "layout": "tn"},
               "kernels": [{"tile": [128, 128, 128], "cluster": [1, 1], "block_scale": {"scale": "e8m0", "block": 64}}]}
    path = world.root / "catalog" / "gemm" / "fuzz.yaml"
    path.write_text(yaml.safe_dump(catalog, sort_keys=False))
    diagnostics = check_catalog(load_catalog(world.root / "catalog", world.root, [path]), world.facts,
                                world.templates)[2]
    assert any(d.severity is Severity.ERROR and d.location.file == "catalog/gemm/fuzz.yaml" for d in diagnostics)
