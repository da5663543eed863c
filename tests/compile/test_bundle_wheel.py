"""The small bundle as a wheel: its metadata, contents and size budget, a fresh environment that
installs it with plain pip and loads it through its entry point, and `tilekiln inspect` / `diff`."""

from __future__ import annotations

import base64
import configparser
import email.parser
import hashlib
import io
import json
import os
import re
import shutil
import zipfile
from pathlib import Path

import pytest
from click.testing import CliRunner
from packaging.requirements import Requirement

import tilekiln
from builder.cli.commands import main
from builder.package.manifest import runtime_requirement
from builder.package.wheel import WheelTooLarge, make_wheel, package_bundle

pytestmark = pytest.mark.compile

PKG = "tilekiln_kernels_sm90a"
NO_LIMIT = 10**12


def manifest_of(bundle: Path) -> dict:
    return json.loads((bundle / "manifest.json").read_text())


def expected_platform_tag(bundle: Path) -> str:
    """The glibc the catalog targets; the library's own needs are checked in test_small_bundle.py."""
    major, minor = manifest_of(bundle)["bundle"]["glibc"].split(".")
    return f"manylinux_{major}_{minor}_x86_64"


def bundle_bytes(bundle: Path) -> int:
    m = manifest_of(bundle)
    return sum((bundle / rel).stat().st_size for rel in m["files"]) + (bundle / "manifest.json").stat().st_size


@pytest.fixture(scope="module")
def wheel(small_build, tmp_path_factory) -> Path:
    path, _ = package_bundle(small_build.path, tmp_path_factory.mktemp("dist"), NO_LIMIT)
    return path


@pytest.fixture(scope="module")
def installed(venv_factory, wheel, project_wheels):
    venv = venv_factory()
    # Only the bundle is named: pip must find the runtime through the bundle's Requires-Dist.
    proc = venv.pip_install([wheel.parent, project_wheels.runtime.parent], ["tilekiln-kernels-sm90a"])
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return venv


def test_wheel_name_metadata_and_entry_point(small_build, wheel):
    m = manifest_of(small_build.path)
    tag = expected_platform_tag(small_build.path)
    assert wheel.name == f"{PKG}-{m['bundle']['version']}-py3-none-{tag}.whl"
    with zipfile.ZipFile(wheel) as zf:
        dist_info = f"{PKG}-{m['bundle']['version']}.dist-info"
        meta = email.parser.Parser().parsestr(zf.read(f"{dist_info}/METADATA").decode())
        info = email.parser.Parser().parsestr(zf.read(f"{dist_info}/WHEEL").decode())
        entry_points = configparser.ConfigParser()
        entry_points.read_string(zf.read(f"{dist_info}/entry_points.txt").decode())
    assert meta["Metadata-Version"] == "2.1"
    assert meta["Name"] == "tilekiln-kernels-sm90a" and meta["Version"] == m["bundle"]["version"]
    (requires,) = meta.get_all("Requires-Dist")
    assert requires == "tilekiln-runtime" + runtime_requirement(tilekiln.__version__)
    spec = Requirement(requires).specifier
    major, minor = (int(x) for x in tilekiln.__version__.split(".")[:2])
    assert tilekiln.__version__ in spec and f"{major}.{minor}.99" in spec
    assert f"{major}.{minor + 1}.0" not in spec
    if minor > 0:
        assert f"{major}.{minor - 1}.0" not in spec
    assert info["Wheel-Version"] == "1.0" and info["Root-Is-Purelib"] == "false"
    assert info.get_all("Tag") == [f"py3-none-{tag}"]
    assert dict(entry_points["tilekiln.bundles"]) == {"sm90a": f"{PKG}:bundle_dir"}


def test_wheel_carries_exactly_the_bundle_and_a_correct_record(small_build, wheel):
    m = manifest_of(small_build.path)
    with zipfile.ZipFile(wheel) as zf:
        names = zf.namelist()
        members = {n: zf.read(n) for n in names}
        modes = {i.filename: i.external_attr >> 16 for i in zf.infolist()}
    bundle_members = {n.removeprefix(f"{PKG}/bundle/") for n in names if n.startswith(f"{PKG}/bundle/")}
    assert bundle_members == set(m["files"]) | {"manifest.json"}
    for rel in bundle_members:
        assert members[f"{PKG}/bundle/{rel}"] == (small_build.path / rel).read_bytes(), rel
    assert modes[f"{PKG}/bundle/{m['library']}"] & 0o777 == 0o755
    assert f"{PKG}/__init__.py" in names and not any("build-report" in n for n in names)
    dist_info = [n for n in names if ".dist-info/" in n]
    assert names[-len(dist_info):] == dist_info and names[-1].endswith(".dist-info/RECORD")
    record = [line.split(",") for line in members[names[-1]].decode().splitlines()]
    assert sorted(r[0] for r in record) == sorted(names)
    for name, digest, size in record:
        if name == names[-1]:
            assert (digest, size) == ("", "")
            continue
        expected = base64.urlsafe_b64encode(hashlib.sha256(members[name]).digest()).rstrip(b"=").decode()
        assert digest == f"sha256={expected}" and int(size) == len(members[name]), name


def test_wheel_is_byte_reproducible(small_build, wheel, tmp_path):
    copy = tmp_path / "elsewhere" / "sm90a"
    shutil.copytree(small_build.path, copy)
    for path in copy.rglob("*"):
        os.utime(path, (1_700_000_000, 1_700_000_000))
    again, _ = package_bundle(copy, tmp_path / "dist", NO_LIMIT)
    assert again.name == wheel.name
    assert again.read_bytes() == wheel.read_bytes()


def test_size_budget_refuses_with_a_per_kernel_breakdown(small_build, wheel, tmp_path):
    size = wheel.stat().st_size
    out = tmp_path / "dist"
    with pytest.raises(WheelTooLarge) as info:
        package_bundle(small_build.path, out, size - 1)
    assert not out.exists() or not any(out.iterdir()), "nothing is written when the budget is exceeded"
    parts = {r.part for r in info.value.rows}
    assert {k["id"] for k in manifest_of(small_build.path)["kernels"]} | {"library", "manifest"} <= parts
    assert sum(r.wheel_bytes for r in info.value.rows) < size  # compressed members, without zip headers
    assert info.value.diagnostics[0].rule == "WHEEL-SIZE"
    path, _ = package_bundle(small_build.path, out, size)  # exactly at the limit is allowed
    assert path.stat().st_size == size


def test_package_command_reads_the_limit_from_the_catalog(small_build, project_copy, tmp_path):
    settings = project_copy / "catalog" / "catalog.yaml"
    settings.write_text(re.sub(r"wheel_size_limit:.*", "wheel_size_limit: 10KB", settings.read_text()))
    result = CliRunner().invoke(main, ["--root", str(project_copy), "package", str(small_build.path),
                                       "--out", str(tmp_path / "dist")])
    assert result.exit_code == 1, result.output
    assert "WHEEL-SIZE" in result.output and "over the limit of 10,000" in result.output
    for k in manifest_of(small_build.path)["kernels"]:
        assert k["id"] in result.output
    ok = CliRunner().invoke(main, ["--root", str(project_copy), "package", str(small_build.path),
                                   "--out", str(tmp_path / "dist"), "--max-size", "100MB"])
    assert ok.exit_code == 0, ok.output
    assert (tmp_path / "dist" / make_wheel(small_build.path).filename).exists()


def test_installed_wheel_loads_through_its_entry_point_without_build_dependencies(installed, small_build, tmp_path):
    script = """
import importlib.metadata as md, importlib.util, json, os, sys
import tilekiln
locations = tilekiln.bundles()
bundle = tilekiln.load("sm90a")
build_stack = ("cutlass", "jinja2", "pydantic", "yaml", "click", "rich", "elftools")
print(json.dumps({
    "runtime": tilekiln.__file__, "runtime_version": md.version("tilekiln-runtime"),
    "distributions": sorted(d.metadata["Name"] for d in md.distributions()),
    "console_script": os.path.exists(os.path.join(sys.prefix, "bin", "tilekiln")),
    "locations": [[loc.name, str(loc.directory), loc.source] for loc in locations],
    "directory": str(bundle.directory), "kernels": [k.id for k in bundle.kernels],
    "library": bundle._library().kernel_ids(),
    "importable": [m for m in build_stack if importlib.util.find_spec(m) is not None],
    "imported": [m for m in ("builder",) + build_stack if m in sys.modules],
}))
"""
    proc = installed.run(script, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    venv = str(installed.path)
    assert out["runtime"].startswith(venv) and out["runtime_version"] == tilekiln.__version__
    ((name, directory, source),) = out["locations"]
    assert name == "sm90a" and source == "entry point of tilekiln-kernels-sm90a"
    assert directory == out["directory"] and directory.startswith(venv) and directory.endswith(f"{PKG}/bundle")
    ids = [k["id"] for k in manifest_of(small_build.path)["kernels"]]
    assert out["kernels"] == ids and out["library"] == ids
    assert out["importable"] == [] and out["imported"] == []
    assert out["distributions"] == ["tilekiln-kernels-sm90a", "tilekiln-runtime"] and not out["console_script"]


def test_pip_refuses_a_bundle_whose_runtime_range_excludes_the_runtime(small_build, project_wheels, venv_factory,
                                                                       rewrite_manifest, tmp_path):
    copy = tmp_path / "sm90a"
    shutil.copytree(small_build.path, copy)
    major, minor = (int(x) for x in tilekiln.__version__.split(".")[:2])
    newer = runtime_requirement(f"{major}.{minor + 1}.0")
    rewrite_manifest(copy, lambda m: m["bundle"].update(runtime_requires=newer))
    path, _ = package_bundle(copy, tmp_path / "dist", NO_LIMIT)
    proc = venv_factory().pip_install([path.parent, project_wheels.runtime.parent], ["tilekiln-kernels-sm90a"])
    assert proc.returncode != 0
    assert "tilekiln-runtime" in proc.stderr and newer.split(",")[0].lstrip(">=") in proc.stderr, proc.stderr


@pytest.mark.parametrize("form", ["directory", "wheel"])
def test_inspect_lists_kernels_integrity_and_provenance(small_build, wheel, form):
    target = small_build.path if form == "directory" else wheel
    m = manifest_of(small_build.path)
    cubins = {r.kernel_id: r.cubin for r in small_build.records}
    result = CliRunner().invoke(main, ["inspect", "--format", "json", str(target)])
    assert result.exit_code == 0, result.output
    report = json.loads(result.output)
    assert report["integrity"] == {"ok": True, "problem": None}
    assert [k["id"] for k in report["kernels"]] == [k["id"] for k in m["kernels"]]
    # The committed catalog/verification/sm90a.json names some of these cubins: inspect shows the
    # manifest's label, hardware-verified exactly where the manifest records a card.
    verified = {mk["id"]: mk["verification"] for mk in m["kernels"]}
    for k in report["kernels"]:
        assert k["cubin_bytes"] == len(cubins[k["id"]])
        assert k["config"]["tile"] and k["config"]["cluster"] and k["registers"] > 0
        if verified[k["id"]] == "hardware-verified":
            assert k["verification"].startswith("hardware-verified on "), k
        else:
            assert k["verification"] == "compile-verified", k
        assert k["sass"] == next(mk["resources"]["sass"] for mk in m["kernels"] if mk["id"] == k["id"])
    assert report["provenance"]["git_commit"] == m["provenance"]["git_commit"]
    assert report["size"]["total_bytes"] == bundle_bytes(small_build.path)
    if form == "wheel":
        assert report["wheel"]["tag"] in wheel.name and report["size"]["archive_bytes"] == wheel.stat().st_size
    text = CliRunner().invoke(main, ["inspect", str(target)])
    assert text.exit_code == 0, text.output
    assert "integrity: ok" in text.output and m["provenance"]["git_commit"] in text.output
    for k in m["kernels"]:
        row = next(line for line in text.output.splitlines() if line.startswith(k["id"] + " "))
        assert "x".join(map(str, k["config"]["tile"])) in row and str(k["resources"]["registers"]) in row
        assert f"HGMMA {k['resources']['sass']['HGMMA']}" in row


def test_inspect_reports_a_damaged_bundle_and_fails(small_build, tmp_path):
    copy = tmp_path / "sm90a"
    shutil.copytree(small_build.path, copy)
    source = sorted((copy / "sources").glob("*.py.txt"))[0]
    source.write_bytes(source.read_bytes()[:-1])
    result = CliRunner().invoke(main, ["inspect", str(copy)])
    assert result.exit_code == 1
    assert f"integrity: FAILED: bundle sm90a: sources/{source.name}: sha256 mismatch" in result.output
    junk = tmp_path / "junk.whl"
    junk.write_bytes(b"not a zip")
    bad = CliRunner().invoke(main, ["inspect", str(junk)])
    assert bad.exit_code == 1 and "INSPECT-INPUT" in bad.output


def test_diff_lists_added_removed_changed_and_the_size_delta(small_build, wheel, rewrite_manifest, tmp_path):
    new = tmp_path / "sm90a"
    shutil.copytree(small_build.path, new)
    kept, dropped = sorted(manifest_of(new)["kernels"], key=lambda k: k["id"])
    (new / dropped["source"]["file"]).unlink()
    # The kept kernel's code grew by 100 bytes, and the library that holds it with it.
    library = new / manifest_of(new)["library"]
    library.write_bytes(library.read_bytes() + b"\0" * 100)

    def edit(m):
        m["bundle"]["version"] = "9.9.9"
        m["kernels"] = [k for k in m["kernels"] if k["id"] != dropped["id"]]
        del m["files"][dropped["source"]["file"]]
        m["files"][m["library"]] = hashlib.sha256(library.read_bytes()).hexdigest()
        m["kernels"][0]["cubin"].update(sha256="0" * 64, bytes=kept["cubin"]["bytes"] + 100)
        m["tuning_tables"] = [{"device": "simulated", "compute_capability": [9, 0], "sm_count": 132,
                               "memory_mib": 81920, "table": {"bucket-x": kept["id"]}, "measurements": {}}]

    rewrite_manifest(new, edit)
    result = CliRunner().invoke(main, ["diff", "--format", "json", str(small_build.path), str(new)])
    assert result.exit_code == 0, result.output
    d = json.loads(result.output)
    assert d["added"] == [] and [k["id"] for k in d["removed"]] == [dropped["id"]]
    (changed,) = d["changed"]
    assert changed["id"] == kept["id"]
    assert changed["fields"]["cubin.bytes"] == [kept["cubin"]["bytes"], kept["cubin"]["bytes"] + 100]
    assert set(changed["fields"]) == {"cubin.bytes", "cubin.sha256"}
    assert d["bundle"]["bundle.version"] == [manifest_of(small_build.path)["bundle"]["version"], "9.9.9"]
    assert d["bundle"]["tuning.simulated.table.bucket-x"] == [None, kept["id"]]
    assert d["size"]["delta_bytes"] == bundle_bytes(new) - bundle_bytes(small_build.path)
    back = json.loads(CliRunner().invoke(main, ["diff", "--format", "json", str(new), str(small_build.path)]).output)
    assert [k["id"] for k in back["added"]] == [dropped["id"]] and back["removed"] == []
    text = CliRunner().invoke(main, ["diff", str(small_build.path), str(new)]).output
    assert re.search(rf"^-\s+{dropped['id']}\s+{dropped['cubin']['bytes']}\s+removed", text, re.M), text
    assert re.search(rf"^~\s+{kept['id']}\s+\+100\s+cubin.bytes", text, re.M), text
    assert "0 added, 1 removed, 1 changed" in text
    assert "1 shape buckets measured on simulated" in CliRunner().invoke(main, ["inspect", str(new)]).output
    same = json.loads(CliRunner().invoke(main, ["diff", "--format", "json", str(small_build.path), str(wheel)]).output)
    assert (same["added"], same["removed"], same["changed"], same["bundle"]) == ([], [], [], {})


def test_package_refuses_a_library_that_needs_more_glibc_than_its_manifest_promises(small_build, rewrite_manifest,
                                                                                    tmp_path):
    copy = tmp_path / "sm90a"
    shutil.copytree(small_build.path, copy)
    rewrite_manifest(copy, lambda m: m["bundle"].update(glibc="2.16"))  # the library needs GLIBC_2.17
    result = CliRunner().invoke(main, ["package", str(copy), "--out", str(tmp_path / "dist"), "--max-size", "1GB"])
    assert result.exit_code == 1
    assert f"{copy / 'manifest.json'}: error: GLIBC-TARGET" in result.output and "[bundle.glibc]" in result.output
    assert "needs glibc 2.17" in result.output and not (tmp_path / "dist").exists()


def test_package_refuses_a_damaged_bundle_naming_the_file(small_build, tmp_path):
    copy = tmp_path / "sm90a"
    shutil.copytree(small_build.path, copy)
    source = sorted((copy / "sources").glob("*.py.txt"))[0]
    source.write_text(source.read_text() + "# edited after the build\n")
    result = CliRunner().invoke(main, ["package", str(copy), "--out", str(tmp_path / "dist"), "--max-size", "1GB"])
    assert result.exit_code == 1
    assert "WHEEL-INPUT" in result.output and f"sources/{source.name}: sha256 mismatch" in result.output
    assert not (tmp_path / "dist").exists()


def test_a_signed_bundle_s_wheel_carries_its_signature_and_loads_signed(small_build, tmp_path):
    """The bundle directory a wheel installs (its ``bundle/`` members) verifies against the key
    the directory was signed with."""
    from builder.package.sign import generate_key, sign_bundle

    copy = tmp_path / "sm90a"
    shutil.copytree(small_build.path, copy)
    private, public, _ = generate_key(tmp_path / "key")
    sign_bundle(copy, private)
    wheel = make_wheel(copy)
    installed = tmp_path / "site-packages"
    with zipfile.ZipFile(io.BytesIO(wheel.data)) as zf:
        assert zf.read(f"{PKG}/bundle/signature.json") == (copy / "signature.json").read_bytes()
        zf.extractall(installed, [n for n in zf.namelist() if n.startswith(f"{PKG}/bundle/")])
    assert tilekiln.load(installed / PKG / "bundle", trusted_keys=[public]).name == "sm90a"


def test_package_refuses_a_signature_of_another_manifest(small_build, tmp_path):
    from builder.package.sign import generate_key, sign_bundle

    copy = tmp_path / "sm90a"
    shutil.copytree(small_build.path, copy)
    sign_bundle(copy, generate_key(tmp_path / "key")[0])
    record = json.loads((copy / "signature.json").read_text())
    record["manifest_sha256"] = "0" * 64
    (copy / "signature.json").write_text(json.dumps(record))
    result = CliRunner().invoke(main, ["package", str(copy), "--out", str(tmp_path / "dist"), "--max-size", "1GB"])
    assert result.exit_code == 1 and "WHEEL-INPUT" in result.output and not (tmp_path / "dist").exists()
