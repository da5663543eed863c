"""Cache keys, the content cache and output publishing, without the DSL."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

import builder.pipeline.build as build_module
from builder.compile.cache import ContentCache, canonical_key
from builder.compile.claims import Claims
from builder.compile.job import CompileJob
from builder.compile.objfile import EntryPoints
from builder.compile.records import BuildRecord
from builder.package.bundle import BundleFile, write_bundle
from builder.package.publish import REPORT_NAME, bundle_is_current, publish_tree, remove_leftovers, tree_digests
from builder.pipeline.build import object_key
from builder.pipeline.reproduce import compare_trees
from tilekiln.bundle_files import SIGNATURE_NAME
from tilekiln.spec import Scaling

REPO = Path(__file__).resolve().parents[2]
JOB = CompileJob("k", "sm_90a", "SOURCE = 1\n")


# -- keys --------------------------------------------------------------------------------------

def test_object_key_is_stable_for_identical_inputs():
    assert object_key(JOB) == object_key(CompileJob("k", "sm_90a", "SOURCE = 1\n"))
    assert canonical_key({"a": 1, "b": 2}) == canonical_key({"b": 2, "a": 1})


def test_object_key_ignores_the_kernel_id():
    """Objects are content-addressed: a renamed kernel with the same source is the same object."""
    assert object_key(JOB) == object_key(CompileJob("renamed", "sm_90a", JOB.source))


@pytest.mark.parametrize("component", ["source", "arch", "options", "compiler", "inspector", "protocol", "env"])
def test_object_key_changes_with_each_component(component, monkeypatch):
    before = object_key(JOB)
    job = JOB
    if component == "source":
        job = CompileJob("k", "sm_90a", "SOURCE = 2\n")
    elif component == "arch":
        job = CompileJob("k", "sm_100a", JOB.source)
    elif component == "options":
        monkeypatch.setattr("builder.compile.job.HOST_TARGET", "llvm -mtriple=aarch64-unknown-linux-gnu")
    elif component == "compiler":
        monkeypatch.setattr(build_module, "compiler_fingerprint", lambda: "nvidia-cutlass-dsl==9.9")
    elif component == "inspector":
        monkeypatch.setattr(build_module, "inspector_fingerprint", lambda: "nvidia-cuda-cuobjdump==99")
    elif component == "protocol":
        monkeypatch.setattr(build_module, "COMPILE_PROTOCOL", build_module.COMPILE_PROTOCOL + 1)
    elif component == "env":
        monkeypatch.setattr(build_module, "COMPILE_ENV", (("CUTE_DSL_LINEINFO", "1"),))
    assert object_key(job) != before


def _records(*objects: bytes) -> list[BuildRecord]:
    # Linking reads only a record's family, scaling and plan (no carveout: not a tcgen05 plan).
    ctx = SimpleNamespace(entry=SimpleNamespace(config=SimpleNamespace(family="gemm", scaling=Scaling.TENSOR)),
                          plan=SimpleNamespace())
    return [BuildRecord(f"k{i}", "sm_90a", "compiled", 0.0, ctx=ctx, object_bytes=o,
                         entry=EntryPoints(f"tk_{i}", f"init{i}", f"load{i}", f"launch{i}"))
            for i, o in enumerate(objects)]


def test_link_is_cached_by_its_inputs(tmp_path, monkeypatch):
    links = []

    def fake_link(bundle, inputs, output, glibc):
        links.append([k.kernel_id for k in inputs])
        output.write_bytes(b"lib:" + b"".join(k.object_bytes for k in inputs))

    monkeypatch.setattr(build_module, "link_library", fake_link)
    cache = ContentCache(tmp_path)
    glibc = (2, 28)
    assert build_module.link_cached("sm90a", _records(b"a", b"b"), cache, glibc) == b"lib:ab"
    assert build_module.link_cached("sm90a", _records(b"a", b"b"), cache, glibc) == b"lib:ab"
    assert len(links) == 1, "the same inputs link once"
    build_module.link_cached("sm90a", _records(b"a", b"c"), cache, glibc)
    build_module.link_cached("sm90a", _records(b"a"), cache, glibc)
    build_module.link_cached("sm90a", _records(b"a"), cache, (2, 17))
    monkeypatch.setattr(build_module, "link_recipe", lambda: {"cflags": ["-O3"]})
    build_module.link_cached("sm90a", _records(b"a"), cache, glibc)
    assert len(links) == 5
    assert not list((tmp_path / "tmp").iterdir())


# -- the content cache -------------------------------------------------------------------------

def test_put_then_get_round_trips(tmp_path):
    cache = ContentCache(tmp_path)
    cache.put("kernel", "ab" * 32, {"kernel.o": b"obj"}, {"seconds": 1.5})
    hit = cache.get("kernel", "ab" * 32)
    assert hit.read("kernel.o") == b"obj" and hit.meta == {"seconds": 1.5}
    assert cache.get("kernel", "cd" * 32) is None


def test_a_corrupt_entry_is_a_miss_and_is_replaced(tmp_path):
    cache = ContentCache(tmp_path)
    key = "ab" * 32
    entry = cache.put("kernel", key, {"kernel.o": b"obj"}, {})
    (entry.directory / "kernel.o").write_bytes(b"half")
    assert cache.get("kernel", key) is None
    assert len(list((tmp_path / "quarantine").iterdir())) == 1
    cache.put("kernel", key, {"kernel.o": b"obj"}, {})
    assert cache.get("kernel", key).read("kernel.o") == b"obj"


def test_an_entry_under_the_wrong_key_is_a_miss(tmp_path):
    cache = ContentCache(tmp_path)
    entry = cache.put("kernel", "ab" * 32, {"kernel.o": b"obj"}, {})
    moved = entry.directory.parent / ("ac" * 32)
    entry.directory.rename(moved)
    assert cache.get("kernel", "ac" * 32) is None


def test_a_hit_hands_out_the_bytes_it_verified(tmp_path):
    """A file changed on disk after the check is never what a build reads."""
    cache = ContentCache(tmp_path)
    cache.put("kernel", "ab" * 32, {"kernel.o": b"obj"}, {})
    hit = cache.get("kernel", "ab" * 32)
    (hit.directory / "kernel.o").write_bytes(b"swapped")
    assert hit.read("kernel.o") == b"obj"


CLAIM_SCRIPT = """
import sys, time
from pathlib import Path
sys.path.insert(0, sys.argv[1])
from builder.compile.claims import Claims
claims = Claims(Path(sys.argv[2]), "kernel")
claimed, _ = claims.take(["k1", "k2"], str)
print(" ".join(claimed), flush=True)
time.sleep(600)
"""


def test_a_claim_of_a_killed_build_is_released_and_claims_are_taken_once(tmp_path):
    holder = subprocess.Popen([sys.executable, "-c", CLAIM_SCRIPT, str(REPO), str(tmp_path)], stdout=subprocess.PIPE,
                              text=True)
    try:
        assert holder.stdout.readline().split() == ["k1", "k2"]
        with Claims(tmp_path, "kernel") as claims:
            assert claims.take(["k1", "k2", "k3", "k3"], str) == (["k3"], ["k1", "k2", "k3"])
            holder.kill()
            start = time.monotonic()
            claims.wait("k1")
            assert time.monotonic() - start < 5, "the OS releases a dead holder's claim"
            assert claims.take(["k2"], str) == (["k2"], [])
        with Claims(tmp_path, "kernel") as again:
            assert again.take(["k1", "k2", "k3"], str) == (["k1", "k2", "k3"], []), "leaving releases them all"
    finally:
        holder.kill()
        holder.wait()


PUT_SCRIPT = """
import sys, time
from pathlib import Path
sys.path.insert(0, sys.argv[1])
from builder.compile.cache import ContentCache
root, barrier, me = Path(sys.argv[2]), Path(sys.argv[3]), sys.argv[4]
while not barrier.exists():
    time.sleep(0.001)
entry = ContentCache(root).put("kernel", "ab" * 32, {"kernel.o": b"x" * 2_000_000}, {"writer": me})
print(entry.meta["writer"])
"""


def test_concurrent_puts_of_one_key_leave_one_valid_entry(tmp_path):
    barrier = tmp_path / "go"
    procs = [subprocess.Popen([sys.executable, "-c", PUT_SCRIPT, str(REPO), str(tmp_path / "cache"), str(barrier),
                               str(i)], stdout=subprocess.PIPE, text=True) for i in range(6)]
    time.sleep(0.3)
    barrier.touch()
    writers = [p.communicate(timeout=60)[0].strip() for p in procs]
    assert all(p.returncode == 0 for p in procs)
    hit = ContentCache(tmp_path / "cache").get("kernel", "ab" * 32)
    assert hit is not None and hit.read("kernel.o") == b"x" * 2_000_000
    # Whoever lost the race got the winner's entry back, never a second copy.
    assert set(writers) == {hit.meta["writer"]}
    assert not list((tmp_path / "cache" / "tmp").iterdir())
    assert len(list((tmp_path / "cache" / "v1" / "kernel").glob("*/*"))) == 1


def test_sweep_removes_only_what_dead_writers_left(tmp_path):
    cache = ContentCache(tmp_path)
    mine = cache.temp_path("link")
    mine.mkdir()
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True,
                          text=True).stdout.strip()
    orphan = mine.with_name(mine.name.replace(f".{os.getpid()}.", f".{dead}."))
    orphan.mkdir()
    other_host = mine.with_name(mine.name.replace(mine.name.split(".")[1], "elsewhere"))
    other_host.mkdir()
    assert cache.sweep() == 1
    assert mine.exists() and other_host.exists() and not orphan.exists()


# -- publishing --------------------------------------------------------------------------------

def _bundle(out: Path, files: list[BundleFile], manifest: dict) -> Path:
    return write_bundle(out, "sm90a", files, manifest, extra={REPORT_NAME: b"{}"})


def test_bundle_is_current_only_for_identical_content(tmp_path):
    files = [BundleFile("lib/x.so", b"lib"), BundleFile("cubins/a.cubin", b"cubin")]
    manifest = {"schema_version": "1.0", "kernels": [{"id": "a", "tile": [1, 2, 3]}]}
    final = _bundle(tmp_path, files, manifest)
    assert bundle_is_current(final, files, manifest)
    assert not bundle_is_current(final, files, {**manifest, "kernels": []})
    assert not bundle_is_current(final, files[:1], manifest)
    assert not bundle_is_current(final, [BundleFile("lib/x.so", b"LIB"), files[1]], manifest)
    (final / "cubins" / "a.cubin").write_bytes(b"tampered")
    assert not bundle_is_current(final, files, manifest)
    (final / "cubins" / "a.cubin").write_bytes(b"cubin")
    (final / "stray").write_bytes(b"")
    assert not bundle_is_current(final, files, manifest)
    assert not bundle_is_current(tmp_path / "absent", files, manifest)


def test_a_signed_bundle_stays_current_and_keeps_its_signature(tmp_path):
    """signature.json signs the manifest's bytes: a rebuild that would write the same bundle
    leaves it, signature included (a rewrite would drop it); a changed bundle is rewritten."""
    files = [BundleFile("lib/x.so", b"lib")]
    manifest = {"schema_version": "1.0", "kernels": [{"id": "a", "tile": [1, 2, 3]}]}
    final = _bundle(tmp_path, files, manifest)
    (final / SIGNATURE_NAME).write_text("{}")
    assert bundle_is_current(final, files, manifest)
    assert not bundle_is_current(final, files, {**manifest, "kernels": []})


def test_publish_tree_rewrites_only_what_changed_and_clears_leftovers(tmp_path):
    final = tmp_path / "shards" / "sm90a" / "1-of-2"
    publish_tree(tmp_path, final, {"a": b"1", "d/b": b"2"}, b"report 1")
    inode = (final / "a").stat().st_ino
    (final.parent / ".staging-1-of-2-0123456789ab").mkdir()
    publish_tree(tmp_path, final, {"a": b"1", "d/b": b"2"}, b"report 2")
    assert (final / "a").stat().st_ino == inode and (final / REPORT_NAME).read_bytes() == b"report 2"
    assert not (final.parent / ".staging-1-of-2-0123456789ab").exists()
    publish_tree(tmp_path, final, {"a": b"changed"}, b"report 3")
    assert tree_digests(final).keys() == {"a"} and (final / "a").read_bytes() == b"changed"


def test_remove_leftovers_matches_only_its_own_output(tmp_path):
    for name in (".staging-sm90a-0123456789ab", ".old-sm90a-0123456789ab", ".staging-sm90af-0123456789ab",
                 "sm90a"):
        (tmp_path / name).mkdir()
    (tmp_path / ".sm90a.build-report.json.0123456789ab.tmp").write_text("half")
    (tmp_path / "sm90a" / ".build-report.json.0123456789ab.tmp").write_text("half")
    (tmp_path / "sm90a" / "manifest.json").write_text("{}")
    assert remove_leftovers(tmp_path / "sm90a") == 4
    assert sorted(p.name for p in tmp_path.iterdir()) == [".staging-sm90af-0123456789ab", "sm90a"]
    assert [p.name for p in (tmp_path / "sm90a").iterdir()] == ["manifest.json"]


def test_compare_trees_names_every_differing_file(tmp_path):
    for side, files in (("a", {"x": b"1", "y/z": b"2", "only-a": b""}), ("b", {"x": b"1", "y/z": b"3"})):
        for name, data in files.items():
            (tmp_path / side / name).parent.mkdir(parents=True, exist_ok=True)
            (tmp_path / side / name).write_bytes(data)
        (tmp_path / side / REPORT_NAME).write_text(json.dumps({"side": side}))
    found = {d.location.file: d.message for d in compare_trees(tmp_path / "a", tmp_path / "b", tmp_path)}
    assert found.keys() == {"a/y/z", "a/only-a"}
    assert "differs" in found["a/y/z"] and "did not write" in found["a/only-a"]
