"""A two-kernel catalog builds into a verified, driver-only bundle."""

from __future__ import annotations

import hashlib
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.compile

ALLOWED_NEEDED = {"libc.so.6", "libdl.so.2", "libpthread.so.0", "librt.so.1", "libm.so.6",
                  # glibc's dynamic loader, listed by every glibc >= 2.34 shared object
                  "ld-linux-x86-64.so.2"}


def test_bundle_has_both_kernels(small_build):
    manifest = json.loads((small_build.path / "manifest.json").read_text())
    ids = [k["id"] for k in manifest["kernels"]]
    assert ids == sorted(["gemm_sm90_bf16_bf16_f32_bf16_tn_128x128x64_c1x1",
                          "gemm_sm90_bf16_bf16_f32_bf16_tn_64x128x64_c1x2"])
    assert manifest["bundle"]["arch"] == "sm_90a" and manifest["bundle"]["name"] == "sm90a"
    # the floor of the linked static runtime (nvidia-cuda-runtime 13.0.x), read from its header
    assert manifest["bundle"]["driver_requires"] == {"cuda_version": 13000, "linux_driver": "580.65.06"}
    for k in manifest["kernels"]:
        assert k["resources"]["sass"]["HGMMA"] > 0, "the WGMMA mainloop must compile to HGMMA"
        assert not k["resources"]["spills"]
        assert k["contract"]["stride_divisibility"] == {"a": 8, "b": 8, "c": 8}


def test_manifest_hashes_match_files(small_build):
    manifest = json.loads((small_build.path / "manifest.json").read_text())
    assert manifest["files"], "the manifest lists its files"
    for relative, digest in manifest["files"].items():
        assert hashlib.sha256((small_build.path / relative).read_bytes()).hexdigest() == digest, relative


def test_each_byte_is_stored_once_and_every_cubin_is_inside_the_library(small_build):
    manifest = json.loads((small_build.path / "manifest.json").read_text())
    on_disk = {p.relative_to(small_build.path).as_posix() for p in small_build.path.rglob("*") if p.is_file()}
    assert on_disk == set(manifest["files"]) | {"manifest.json", "build-report.json"}
    assert set(manifest["files"]) == {manifest["library"]} | {k["source"]["file"] for k in manifest["kernels"]}
    assert all(k["source"]["file"].endswith(".py.txt") for k in manifest["kernels"]), "sources are not modules"
    assert len(set(manifest["files"].values())) == len(manifest["files"]), "two files hold the same bytes"
    library = (small_build.path / manifest["library"]).read_bytes()
    cubins = {r.kernel_id: r.cubin for r in small_build.records}
    for k in manifest["kernels"]:
        cubin = cubins[k["id"]]
        assert cubin[:4] == b"\x7fELF" and (hashlib.sha256(cubin).hexdigest(), len(cubin)) == (
            k["cubin"]["sha256"], k["cubin"]["bytes"])
        assert cubin in library, f"{k['id']}: its cubin is not in the library, so dropping cubins/ lost it"


def test_library_needs_only_libc_and_the_loader(small_build):
    lib = small_build.path / "lib" / "libtilekiln_sm90a.so"
    from elftools.elf.dynamic import DynamicSection
    from elftools.elf.elffile import ELFFile

    with open(lib, "rb") as f:
        elf = ELFFile(f)
        needed = {t.needed for s in elf.iter_sections() if isinstance(s, DynamicSection)
                  for t in s.iter_tags() if t.entry.d_tag == "DT_NEEDED"}
        exported = {sym.name for s in elf.iter_sections() if s.name == ".dynsym" for sym in s.iter_symbols()
                    if sym["st_info"]["bind"] == "STB_GLOBAL" and sym["st_shndx"] != "SHN_UNDEF"}
    assert needed <= ALLOWED_NEEDED, needed
    assert "libcuda.so.1" not in needed and not any("cudart" in n for n in needed)
    assert exported and all(name.startswith("tk_") for name in exported), sorted(exported)[:10]


def test_library_needs_no_glibc_newer_than_the_catalog_targets(small_build):
    """Read from the version strings in the library's bytes, independently of builder/package/platform_tag.py."""
    manifest = json.loads((small_build.path / "manifest.json").read_text())
    target = tuple(int(p) for p in manifest["bundle"]["glibc"].split("."))
    assert target == (2, 28)
    library = (small_build.path / manifest["library"]).read_bytes()
    needed = {(int(a), int(b)) for a, b in re.findall(rb"GLIBC_(\d+)\.(\d+)", library)}
    assert needed and max(needed) <= target, sorted(needed)


def test_runtime_reads_the_bundle_without_build_dependencies(small_build):
    """A process that cannot import the build stack (-S: no site-packages) loads the bundle."""
    repo = Path(__file__).resolve().parents[2]
    script = f"""
import sys
sys.path.insert(0, {str(repo)!r})
import tilekiln
b = tilekiln.load({str(small_build.path)!r})
ids = b._library().kernel_ids()
assert ids == [k.id for k in b.kernels], ids
for banned in ("builder", "cutlass", "jinja2", "pydantic", "yaml", "torch"):
    assert banned not in sys.modules, banned
print(len(ids))
"""
    proc = subprocess.run([sys.executable, "-S", "-c", script], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "2"
