"""The three kinds of wheel `make wheel` writes: the runtime (tilekiln-runtime, `import tilekiln`), the
build tool (tilekiln-build: `builder` and the `tilekiln` command) and a bundle (tilekiln-kernels-<bundle>).
Their metadata agree with each other, each holds only its own part, and the packaging linters pass them."""

from __future__ import annotations

import email.message
import email.parser
import hashlib
import re
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name, parse_wheel_filename
from packaging.version import Version

import tilekiln
from builder.package.wheel import package_bundle

pytestmark = pytest.mark.compile

ROOT = Path(__file__).resolve().parents[2]
PKG = "tilekiln_kernels_sm90a"


@pytest.fixture(scope="module")
def bundle_wheel(small_build, tmp_path_factory) -> Path:
    path, _ = package_bundle(small_build.path, tmp_path_factory.mktemp("dist"), 10**12)
    return path


def members(wheel: Path) -> dict[str, bytes]:
    with zipfile.ZipFile(wheel) as zf:
        return {name: zf.read(name) for name in zf.namelist()}


def dist_info(wheel: Path, name: str) -> bytes | None:
    """A dist-info file of ``wheel``, or None if it has none of that name."""
    found = [data for member, data in members(wheel).items() if member.endswith(f".dist-info/{name}")]
    return found[0] if found else None


def metadata(wheel: Path) -> email.message.Message:
    return email.parser.Parser().parsestr(dist_info(wheel, "METADATA").decode())


def requirements_of(wheel: Path) -> list[Requirement]:
    return [Requirement(r) for r in metadata(wheel).get_all("Requires-Dist") or ()]


def requirements(wheel: Path) -> dict[str, Requirement]:
    return {canonicalize_name(r.name): r for r in requirements_of(wheel)}


def top_level(wheel: Path) -> set[str]:
    return {name.split("/")[0] for name in members(wheel)}


def test_bundle_wheels_require_exactly_the_runtime_distribution_in_a_range_it_satisfies(project_wheels,
                                                                                        bundle_wheel):
    runtime = metadata(project_wheels.runtime)
    assert canonicalize_name(runtime["Name"]) == "tilekiln-runtime" and runtime["Version"] == tilekiln.__version__
    (runtime_req,) = requirements(bundle_wheel).values()
    assert canonicalize_name(runtime_req.name) == canonicalize_name(runtime["Name"]) and not runtime_req.extras
    assert runtime_req.specifier.contains(Version(runtime["Version"]))
    # Every wheel's file name names the distribution its metadata does.
    for wheel in (project_wheels.runtime, project_wheels.build, bundle_wheel):
        name, version, _, _ = parse_wheel_filename(wheel.name)
        assert (name, str(version)) == (canonicalize_name(metadata(wheel)["Name"]), metadata(wheel)["Version"])
        # PyPI's `tilekiln` is another project: no wheel may name it.
        assert "tilekiln" not in requirements(wheel) and name != "tilekiln"


def test_runtime_wheel_holds_only_the_tilekiln_package_and_no_command(project_wheels):
    wheel = project_wheels.runtime
    version = metadata(wheel)["Version"]
    assert top_level(wheel) == {"tilekiln", f"tilekiln_runtime-{version}.dist-info"}
    package = {name for name in members(wheel) if name.startswith("tilekiln/")}
    assert package == {p.relative_to(ROOT).as_posix() for p in (ROOT / "tilekiln").rglob("*.py")}  # subpackages too
    assert dist_info(wheel, "entry_points.txt") is None, "the runtime installs no console script"
    unconditional = [r for r in requirements_of(wheel) if r.marker is None]
    assert unconditional == [], "the runtime needs only the standard library"
    (signatures,) = requirements_of(wheel)  # checking bundle signatures, on request (tilekiln/signing.py)
    assert signatures.name == "cryptography" and signatures.marker.evaluate({"extra": "signatures"})


def test_build_wheel_owns_the_command_and_pins_the_runtime_of_its_release(project_wheels):
    wheel = project_wheels.build
    version = metadata(wheel)["Version"]
    assert version == metadata(project_wheels.runtime)["Version"]
    assert top_level(wheel) == {"builder", f"tilekiln_build-{version}.dist-info"}
    assert "builder/package/link.py" in members(wheel) and not any(n.startswith("tilekiln/") for n in members(wheel))
    assert re.search(r"^\[console_scripts\]\ntilekiln = builder\.cli\.entry:main$", dist_info(wheel, "entry_points.txt")
                     .decode(), re.M)
    reqs = requirements(wheel)
    assert str(reqs["tilekiln-runtime"].specifier) == f"=={version}"
    assert {"nvidia-cutlass-dsl", "ziglang", "click"} <= reqs.keys()


def test_bundle_wheel_holds_each_byte_once_and_no_module_but_its_package(bundle_wheel):
    files = {name: data for name, data in members(bundle_wheel).items() if not name.endswith("/RECORD")}
    assert [name for name in files if name.endswith(".py")] == [f"{PKG}/__init__.py"]
    assert not any(name.endswith(".cubin") for name in files)
    digests = [hashlib.sha256(data).hexdigest() for data in files.values()]
    assert len(set(digests)) == len(digests), "two members hold the same bytes"


def test_auditwheel_finds_the_bundle_wheel_manylinux_2_28_or_lower(bundle_wheel):
    proc = subprocess.run([sys.executable, "-m", "auditwheel", "show", str(bundle_wheel)],
                          capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    # "... is consistent with the following platform tag: "manylinux_2_17_x86_64"."
    found = re.search(r'platform tag:\s+"manylinux_(\d+)_(\d+)_x86_64"', proc.stdout)
    assert found, proc.stdout
    audited = (int(found.group(1)), int(found.group(2)))
    (tag,) = parse_wheel_filename(bundle_wheel.name)[3]
    claimed = tuple(int(x) for x in re.fullmatch(r"manylinux_(\d+)_(\d+)_x86_64", tag.platform).groups())
    assert audited <= claimed == (2, 28), (audited, claimed)


def test_check_wheel_contents_passes_every_wheel(project_wheels, bundle_wheel):
    wheels = [project_wheels.runtime, project_wheels.build, bundle_wheel]
    proc = subprocess.run([sys.executable, "-m", "check_wheel_contents", *map(str, wheels)],
                          capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.count(": OK") == len(wheels), proc.stdout
