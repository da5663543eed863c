"""Hostile and careless inputs to the builder, inspect and the runtime's argument readers.

Each ends in located diagnostics (or a named exception at the runtime),
never a traceback, a hang or a file written outside the output directory;
no string of a catalog, facts file, template manifest or tuning table
reaches rendered source unless its grammar makes it a typed value.
"""

from __future__ import annotations

import json
import os
import shutil
import time
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner

from builder.check.validate import Project, validate_project
from builder.cli.commands import main as cli
from builder.compile.parallel import LocalExecutor
from builder.diagnostics import Diagnostic, DiagnosticError, Severity
from builder.load.yamlsrc import load_yaml
from builder.pipeline.build import BuildRequest, build
from builder.render import render_kernel
from tests.fixture_catalogs import make_project
from tests.records import kernel_record, write_bundle
from tilekiln._tensors import describe
from tilekiln.manifest import Sku, TuningTable, read_manifest
from tilekiln.tuning.table import write_tuning_file

CATALOG = """pipeline: sm100
targets: [sm_100a]
defaults:
  dtypes: {a: bf16, b: bf16, acc: f32, c: bf16}
  layout: tn
kernels:
  - tile: [128, 128, 64]
    cluster: [1, 1]
"""
KERNEL = "gemm_sm100_bf16_bf16_f32_bf16_tn_128x128x64_c1x1"
BUCKET = "bf16/bf16->bf16:tn:4096x4096x4096:1"
# Python, Jinja, shell and path fragments; PWNED marks them in any output.
FRAGMENTS = (
    '"); import os; os.system("PWNED") #',
    "{{ 'PWNED' ~ 7*7 }}",
    "{% include '/etc/passwd' %}PWNED",
    "$(touch /tmp/PWNED)",
    "`PWNED`; rm -rf ~",
    "../../../../tmp/PWNED",
    "/tmp/PWNED",
    "sm_90a\n--PWNED",
)


@pytest.fixture
def project(tmp_path: Path) -> Path:
    """A scratch project whose only catalog file is ``catalog/gemm/x.yaml`` (CATALOG), without
    the committed tuning table (the tests that want one write it)."""
    base = make_project(tmp_path / "project", [])
    shutil.rmtree(base / "catalog" / "tuning")
    (base / "catalog" / "gemm" / "x.yaml").write_text(CATALOG)
    return base


def validate(project: Path) -> tuple[Diagnostic, ...]:
    return validate_project(Project(project)).diagnostics


def located(diagnostics, rule: str) -> set[tuple[str, int | None]]:
    return {(d.location.file, d.location.line) for d in diagnostics if d.rule == rule}


def tree(base: Path) -> dict[str, bytes | None]:
    """Every path under ``base`` with its content (None for directories and other non-files)."""
    return {str(p.relative_to(base)): (p.read_bytes() if p.is_file() and not p.is_symlink() else None)
            for p in sorted(base.rglob("*"))}


def build_writes_nothing(base: Path, project: Path) -> None:
    """A build of ``project`` into ``base/out`` refuses to start and leaves ``base`` as it was."""
    before = tree(base)
    with pytest.raises(DiagnosticError):
        build(BuildRequest(root=project, out_dir=base / "out", cache_dir=base / "cache",
                           executor=LocalExecutor(1), progress="none"))
    assert tree(base) == before


def test_the_scratch_project_is_clean(project):
    assert validate(project) == ()


# -- files that are not text ---------------------------------------------------------------------

FILES = ("catalog/gemm/x.yaml", "catalog/hardware/sm100.yaml", "templates/sm100_gemm.yaml", "catalog/catalog.yaml")
ENCODINGS = {
    # (bytes of the file from its UTF-8 text, line of the diagnostic)
    "latin-1": (lambda text: text.replace("\n", "\n# Schl\xfcssel\n", 1).encode("latin-1"), 2),
    "utf-16": (lambda text: text.encode("utf-16"), 1),
    "nul": (lambda text: text.replace("\n", "\n# \x00\n", 1).encode(), 2),
    "binary": (lambda text: b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR" + text.encode(), 1),
}


@pytest.mark.parametrize("encoding", ENCODINGS)
@pytest.mark.parametrize("relative", FILES)
def test_a_file_that_is_not_utf8_text_is_located(project, relative, encoding):
    convert, line = ENCODINGS[encoding]
    path = project / relative
    path.write_bytes(convert(path.read_text()))
    assert located(validate(project), "YAML-ENCODING") == {(relative, line)}


def test_a_utf8_byte_order_mark_is_read(project):
    path = project / "catalog" / "gemm" / "x.yaml"
    path.write_bytes(b"\xef\xbb\xbf" + path.read_bytes())
    assert validate(project) == ()


@pytest.mark.parametrize("kind", ["fifo", "directory"])
def test_a_catalog_file_that_is_not_a_regular_file_is_refused_without_blocking(project, kind):
    path = project / "catalog" / "gemm" / "y.yaml"
    if kind == "fifo":
        os.mkfifo(path)  # opened for reading, it would wait for a writer forever
    else:
        path.mkdir()
    started = time.monotonic()
    assert located(validate(project), "YAML-IO") == {("catalog/gemm/y.yaml", None)}
    assert time.monotonic() - started < 5


# -- YAML that would exhaust the loader ------------------------------------------------------------

BOMB = "    bomb:\n      a: &a [x, x, x, x, x, x, x, x, x]\n" + "".join(
    f"      {c}: &{c} [{', '.join([f'*{p}'] * 9)}]\n" for p, c in zip("abcdefgh", "bcdefghi"))


@pytest.mark.parametrize("text, line", [
    (CATALOG.replace("[1, 1]", "[" * 5000 + "]" * 5000), 8),  # RecursionError in PyYAML's composer
    (CATALOG + "".join("  " * (i + 2) + f"k{i}:\n" for i in range(200)), 70),  # as deep, in block style
    (CATALOG + BOMB, 15),  # "billion laughs": 9^9 values from 600 bytes
    (CATALOG.replace("kernels:", "kernels: &k").replace("    cluster: [1, 1]", "    cluster: [1, 1]\n  - *k"), 9),
], ids=["deep-flow", "deep-block", "alias-bomb", "recursive-alias"])
def test_structures_that_would_exhaust_the_loader_end_in_a_located_limit(project, text, line):
    (project / "catalog" / "gemm" / "x.yaml").write_text(text)
    started = time.monotonic()
    assert located(validate(project), "YAML-LIMIT") == {("catalog/gemm/x.yaml", line)}
    assert time.monotonic() - started < 5


def test_a_file_over_the_size_bound_is_refused_unread(project):
    items = "".join(f"  - {{tile: [128, 128, 64], cluster: [1, 1], swizzle: {1 + i % 8}}}\n" for i in range(3000))
    (project / "catalog" / "gemm" / "x.yaml").write_text(CATALOG + items)
    assert located(validate(project), "YAML-LIMIT") == {("catalog/gemm/x.yaml", None)}


@pytest.mark.parametrize("value", [
    "!!python/name:os.system PWNED", '!!python/object/apply:os.system ["PWNED"]', "!!binary UFdORUQ=",
    "!!timestamp 2026-01-01", "!layout tn", "!!int one", "!!bool maybe"])
def test_a_tag_that_is_not_plain_data_is_refused(project, value):
    (project / "catalog" / "gemm" / "x.yaml").write_text(CATALOG.replace("layout: tn", f"layout: {value}"))
    assert located(validate(project), "YAML-TAG") == {("catalog/gemm/x.yaml", 5)}


def test_dates_and_merge_keys_are_plain_strings(project):
    """YAML 1.1's implicit dates and ``<<`` would build values the JSON Schema knows nothing of."""
    path = project / "catalog" / "gemm" / "x.yaml"
    path.write_text(CATALOG.replace("layout: tn", "layout: 2026-13-45") + "    <<: {stages: 4}\n")
    diagnostics = validate(project)
    assert {(d.location.line, d.facts.get("input")) for d in diagnostics if d.rule == "CATALOG-SCHEMA"} == {
        (5, "2026-13-45"), (9, None)}


def test_an_unclosed_quote_is_reported_where_it_opens(project):
    text = CATALOG.replace("layout: tn", 'layout: "tn') + "  - tile: [64, 128, 64]\n    cluster: [1, 2]\n"
    (project / "catalog" / "gemm" / "x.yaml").write_text(text)
    assert located(validate(project), "YAML-SYNTAX") == {("catalog/gemm/x.yaml", 5)}


# -- no injection: every string that names something has a grammar -------------------------------

def _set(data, path: tuple, value) -> None:
    for part in path[:-1]:
        data = data[part]
    data[path[-1]] = value


FIELDS = [
    ("catalog/gemm/x.yaml", ("pipeline",)),
    ("catalog/gemm/x.yaml", ("targets", 0)),
    ("catalog/gemm/x.yaml", ("kernels", 0, "targets")),
    ("catalog/gemm/x.yaml", ("defaults", "layout")),
    ("catalog/gemm/x.yaml", ("defaults", "dtypes", "a")),
    ("catalog/gemm/x.yaml", ("kernels", 0, "stages")),
    ("catalog/gemm/x.yaml", ("kernels", 0, "activation")),
    ("catalog/gemm/x.yaml", ("kernels", 0, "family")),
    ("catalog/hardware/sm100.yaml", ("pipeline",)),
    ("catalog/hardware/sm100.yaml", ("targets", 0, "name")),
    ("catalog/hardware/sm100.yaml", ("targets", 0, "kind")),
    ("catalog/hardware/sm100.yaml", ("facts", "mma_instruction", "value")),
    ("templates/sm100_gemm.yaml", ("template",)),
    ("templates/sm100_gemm.yaml", ("pipelines", 0)),
    ("templates/sm100_gemm.yaml", ("families", 0)),
    ("templates/sm100_gemm.yaml", ("parameters", "kind")),
    ("catalog/catalog.yaml", ("version",)),
    ("catalog/catalog.yaml", ("glibc",)),
    ("catalog/catalog.yaml", ("wheel_size_limit",)),
]
# Every field with one fragment, and the fields that name files and compile targets with all of them.
CASES = ([(f, p, FRAGMENTS[i % len(FRAGMENTS)]) for i, (f, p) in enumerate(FIELDS)]
         + [(f, p, x) for f, p in FIELDS[1:3] + FIELDS[12:13] for x in FRAGMENTS])


@pytest.mark.parametrize("relative, path, fragment", CASES,
                         ids=[f"{f.split('/')[-1]}:{'.'.join(map(str, p))}:{i}" for i, (f, p, _) in enumerate(CASES)])
def test_a_code_fragment_in_a_named_field_is_a_located_error(project, relative, path, fragment):
    file = project / relative
    data = yaml.safe_load(file.read_text())
    _set(data, path, [fragment] if path[-1] == "targets" else fragment)
    file.write_text(yaml.safe_dump(data, sort_keys=False, allow_unicode=True))
    line = load_yaml(file).locate(path + (0,) if path[-1] == "targets" else path).line
    errors = [d for d in validate(project) if d.severity is Severity.ERROR]
    assert (relative, line) in {(d.location.file, d.location.line) for d in errors}, [d.to_text() for d in errors]
    assert not [d for d in errors if "PWNED" in d.location.file]


@pytest.mark.parametrize("fragment", ["../../../../tmp/PWNED", "/tmp/PWNED"])
def test_a_build_of_a_catalog_targeting_a_path_writes_nothing(tmp_path, project, fragment):
    file = project / "catalog" / "gemm" / "x.yaml"
    file.write_text(CATALOG.replace("[sm_100a]", json.dumps([fragment])))
    build_writes_nothing(tmp_path, project)


@pytest.mark.parametrize("where", ["relative", "absolute", "link"])
def test_a_template_outside_templates_is_refused_and_nothing_is_built(tmp_path, project, where):
    """The manifest's ``template`` is a plain file name in templates/; a path out of it (``..``, an
    absolute path, a link) would make the build read, and render from, a file anywhere."""
    outside = tmp_path / "evil.py.j2"
    outside.write_text("{{ kernel_id }} PWNED\n")
    manifest = project / "templates" / "sm100_gemm.yaml"
    name = {"relative": "../../evil.py.j2", "absolute": str(outside), "link": "link.py.j2"}[where]
    if where == "link":
        (project / "templates" / "link.py.j2").symlink_to(outside)
    manifest.write_text(manifest.read_text().replace("template: sm100_gemm.py.j2", f"template: {name}"))
    line = load_yaml(manifest).locate(("template",)).line
    assert located(validate(project), "TEMPLATE-MANIFEST") == {("templates/sm100_gemm.yaml", line)}
    build_writes_nothing(tmp_path, project)


def test_free_text_of_facts_and_file_names_never_reaches_rendered_source(project):
    """Sources, descriptions and catalog file names are not typed values: they may hold anything
    printable, and none of it reaches a template."""
    facts = project / "catalog" / "hardware" / "sm100.yaml"
    data = yaml.safe_load(facts.read_text())
    data["description"] = "\n".join(FRAGMENTS)
    for name, fact in data["facts"].items():
        fact["source"] = f"{name} {FRAGMENTS[len(name) % len(FRAGMENTS)]}"
    facts.write_text(yaml.safe_dump(data, sort_keys=False, allow_unicode=True))
    (project / "catalog" / "gemm" / "x.yaml").rename(project / "catalog" / "gemm" / "$(touch PWNED){{7*7}}.yaml")
    result = validate_project(Project(project))
    assert result.diagnostics == () and len(result.kernels) == 1
    text = render_kernel(result.kernels[0]).text
    assert "PWNED" not in text and "7*7" not in text and "/etc/passwd" not in text


# -- committed tuning and verification tables ---------------------------------------------------

# The card a table states it was measured on (builder/load/tuning.py), after the fields a case sets.
B200 = {"compute_capability": [10, 0], "sm_count": 148, "memory_mib": 182630}


def _tuning(**fields) -> str:
    return json.dumps({"device": "NVIDIA B200", "table": {BUCKET: KERNEL}} | B200 | fields, indent=2)


def _line(text: str, marker: str) -> int:
    return text[:text.index(marker)].count("\n") + 1


SM_COUNT_STRING = _tuning(sm_count="148")
MODEL_NAME = _tuning(model={"macs per element": 150.0})
MODEL_VALUE = _tuning(model={"macs_per_element": "150"})


NAN_TABLE = _tuning(measurements={BUCKET: {"candidates": {KERNEL: float("nan")}, "flops": 1, "shape": [1, 1, 1],
                                           "tflops": 1.0}})


@pytest.mark.parametrize("text, line", [
    ('{"device": "NVIDIA H200",\n "table": {,}}', 2),
    ("[1, 2]", 1),
    ('{"device": "NVIDIA H200", "table": {}, "table": {}}', 1),
    (_tuning(table={BUCKET: 5}), 4),
    (_tuning(table={BUCKET: "gemm_sm100_$(touch PWNED)"}), 4),
    (_tuning(table={BUCKET: KERNEL + "/splitk5"}), 4),
    (_tuning(table={"../../PWNED": KERNEL}), 4),
    (_tuning(device="[link=https://PWNED]NVIDIA H200[/link]"), 2),
    (NAN_TABLE, _line(NAN_TABLE, "NaN")),
    ("[" * 3000 + "]" * 3000, 1),
    (json.dumps({"device": "NVIDIA B200", "table": {}}), 1),
    (SM_COUNT_STRING, _line(SM_COUNT_STRING, '"148"')),
    (MODEL_NAME, _line(MODEL_NAME, "macs")),
    (MODEL_VALUE, _line(MODEL_VALUE, "macs")),
], ids=["not-json", "a-list", "duplicate-key", "non-string-choice", "bad-id", "bad-split", "bad-bucket", "markup",
        "nan", "deep", "no-card-facts", "sm-count-string", "model-name", "model-value"])
def test_a_malformed_tuning_table_is_a_located_diagnostic(project, text, line):
    (project / "catalog" / "tuning" / "sm100a").mkdir(parents=True)
    (project / "catalog" / "tuning" / "sm100a" / "b200.json").write_text(text)
    assert located(validate(project), "TUNING-FILE") == {("catalog/tuning/sm100a/b200.json", line)}


def test_a_well_formed_tuning_table_is_accepted(project):
    (project / "catalog" / "tuning" / "sm100a").mkdir(parents=True)
    (project / "catalog" / "tuning" / "sm100a" / "b200.json").write_text(
        _tuning(table={BUCKET: KERNEL + "/splitk2"}, model={"macs_per_element": 150}))
    assert validate(project) == ()


def test_two_tables_of_one_device_and_a_table_at_the_single_table_place_are_located(project):
    """One table per SKU: a second file naming the same device is refused at its ``device``; a table
    left at catalog/tuning/<bundle>.json (where builds read the one table before per-SKU tables) is
    refused rather than silently no longer shipped."""
    tables = project / "catalog" / "tuning" / "sm100a"
    tables.mkdir(parents=True)
    (tables / "b200.json").write_text(_tuning())
    (tables / "b200-again.json").write_text(_tuning())
    (project / "catalog" / "tuning" / "sm100a.json").write_text(_tuning())
    diagnostics = [d for d in validate(project) if d.rule == "TUNING-FILE"]
    assert {(d.location.file, d.location.line) for d in diagnostics} == {
        ("catalog/tuning/sm100a/b200.json", 2), ("catalog/tuning/sm100a.json", None)}
    again, old = sorted(diagnostics, key=lambda d: d.location.line is None)
    assert "a second table of 'NVIDIA B200' (the first is catalog/tuning/sm100a/b200-again.json)" in again.message
    assert "catalog/tuning/sm100a/<device>.json" in old.hint


def _verification(**record) -> str:
    base = {"sku": "H100 80GB HBM3", "device": "NVIDIA H100 80GB HBM3", "compute_capability": [9, 0],
            "driver": "580.159.04", "torch": "2.11.0", "date": "2026-12-06", "seed": 1, "bundle_version": "0.1.0",
            "kernels": {KERNEL: {"cubin_sha256": "0" * 64, "max_rel_error": 0.003, "runs": 6}}, "failed": []}
    return json.dumps({"schema": 1, "bundle": "sm100a", "records": [base | record]}, indent=1, ensure_ascii=False)


@pytest.mark.parametrize("text, marker", [
    ("not json", None),
    ("[]", None),
    (_verification(kernels={"../../PWNED": {"cubin_sha256": "0" * 64, "max_rel_error": 0.0, "runs": 1}}), "PWNED"),
    (_verification(failed=["$(touch PWNED)"]), "PWNED"),
    (_verification(date="٢٠٢٦-12-06"), "٢٠٢٦"),
], ids=["not-json", "a-list", "bad-kernel-id", "bad-failed-id", "arabic-digits"])
def test_a_malformed_verification_file_is_a_located_diagnostic(project, text, marker):
    (project / "catalog" / "verification").mkdir(exist_ok=True)  # the project copies catalog/verification/sm90a.json
    (project / "catalog" / "verification" / "sm100a.json").write_text(text)
    line = text[:text.index(marker)].count("\n") + 1 if marker else 1
    assert located(validate(project), "VERIFICATION-FILE") == {("catalog/verification/sm100a.json", line)}


# -- inspect -----------------------------------------------------------------------------------------

KERNELS = (kernel_record(0, "k_wide", (128, 256, 64)), kernel_record(1, "k_square", (128, 128, 64)))


def test_inspect_prints_markup_in_a_bundle_literally(tmp_path):
    """A tuning file's device name comes from the driver of whatever machine ran tune."""
    directory = write_bundle(tmp_path / "sm90a", KERNELS)
    device = "[bold red]PWNED[/bold red] [link=https://example.invalid]x[/link] :warning:"
    write_tuning_file(directory, (TuningTable(Sku(device, (9, 0), 132, 143156), ((BUCKET, "k_wide"),)),),
                      read_manifest(directory).sha256)
    result = CliRunner().invoke(cli, ["inspect", str(directory)])
    assert result.exit_code == 0, result.output
    assert f"measured on {device}" in result.output


@pytest.mark.parametrize("part", ["manifest.json", "lib/lib.so"])
def test_inspect_of_a_bundle_with_a_directory_in_place_of_a_file_reports_it(tmp_path, part):
    directory = write_bundle(tmp_path / "sm90a", KERNELS)
    (directory / part).unlink()
    (directory / part).mkdir()
    result = CliRunner().invoke(cli, ["inspect", str(directory)])
    assert result.exit_code == 1 and isinstance(result.exception, SystemExit), result.output
    if part == "manifest.json":
        assert "INSPECT-INPUT: bundle sm90a: manifest.json" in result.output
        assert "not a regular file" in result.output
    else:
        assert "integrity: FAILED: bundle sm90a: lib/lib.so: is a directory" in result.output


# -- the runtime's reader of __cuda_array_interface__ ---------------------------------------------

class Array:
    def __init__(self, interface):
        self.__cuda_array_interface__ = interface


GOOD = {"shape": (4, 4), "typestr": "<f2", "data": (0x1000, False), "version": 3}


@pytest.mark.parametrize("interface, key", [
    ({k: v for k, v in GOOD.items() if k != "shape"}, "shape"),
    ({k: v for k, v in GOOD.items() if k != "data"}, "data"),
    ({k: v for k, v in GOOD.items() if k != "typestr"}, "typestr"),
    (GOOD | {"shape": "4x4"}, "shape"),
    (GOOD | {"shape": (4.0, 4)}, "shape"),
    (GOOD | {"shape": (True, 4)}, "shape"),
    (GOOD | {"typestr": 2}, "typestr"),
    (GOOD | {"data": 0x1000}, "data"),
    (GOOD | {"data": ("0x1000", False)}, "data"),
    (GOOD | {"data": (-1, False)}, "data"),
    (GOOD | {"strides": (8,)}, "strides"),
    (GOOD | {"strides": (8, "2")}, "strides"),
])
def test_a_malformed_cuda_array_interface_raises_type_error_naming_argument_and_key(interface, key):
    with pytest.raises(TypeError, match=rf"^b: __cuda_array_interface__\['{key}'\]"):
        describe(Array(interface), "b")


def test_a_cuda_array_interface_that_is_not_a_dict_raises_type_error():
    with pytest.raises(TypeError, match=r"^a: __cuda_array_interface__ must be a dict"):
        describe(Array([4, 4]), "a")
