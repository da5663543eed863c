"""The manylinux tag is the glibc target, and a library that needs more than the target is refused
(tiny libraries built with the pinned zig for a chosen glibc).

The glibc versions a library needs are read independently of the code under
test: a shared library that defines no versions of its own names exactly the
versions it needs in its string table, so a regex over the bytes finds them.
"""

from __future__ import annotations

import platform
import re
import subprocess
from pathlib import Path

import pytest

from builder.compile.toolchain import zig_binary
from builder.diagnostics import DiagnosticError, Location
from builder.package.platform_tag import GlibcTarget, platform_tag

pytestmark = pytest.mark.skipif(platform.machine() != "x86_64", reason="needs x86-64 Linux")

TARGET = GlibcTarget((2, 28), Location("catalog/catalog.yaml", 8, 8, "glibc"))
# On glibc >= 2.34, dlopen and pthread_create are versioned GLIBC_2.34 (libdl and libpthread merged into libc).
THREADS_AND_DLOPEN = """#include <dlfcn.h>
#include <pthread.h>
static void *run(void *arg) { return arg; }
void *start(void) { pthread_t t; pthread_create(&t, 0, run, 0); return dlopen("x", 1); }
"""


def build_library(tmp_path: Path, name: str, source: str, glibc: str, *flags: str) -> bytes:
    (tmp_path / f"{name}.c").write_text(source)
    out = tmp_path / f"lib{name}.so"
    subprocess.run([str(zig_binary()), "cc", "-target", f"x86_64-linux-gnu.{glibc}", "-shared", "-fPIC", "-O2",
                    "-o", str(out), str(tmp_path / f"{name}.c"), *flags], check=True, cwd=tmp_path)
    return out.read_bytes()


def glibc_needed(library: bytes) -> tuple[int, int]:
    found = [(int(a), int(b)) for a, b in re.findall(rb"GLIBC_(\d+)\.(\d+)", library)]
    assert found, "the library names no glibc version"
    return max(found)


def test_the_tag_is_the_target_not_the_lower_version_the_library_needs(tmp_path):
    lib = build_library(tmp_path, "threads", THREADS_AND_DLOPEN, "2.28", "-lpthread", "-ldl")
    tag = platform_tag(lib, "libthreads.so", TARGET)
    assert tag.required == glibc_needed(lib) and tag.required < (2, 28)
    assert tag.tag == "manylinux_2_28_x86_64"
    assert {"libpthread.so.0", "libdl.so.2"} <= set(tag.needed)


def test_a_target_below_pips_lowest_tag_is_tagged_at_that_floor(tmp_path):
    lib = build_library(tmp_path, "puts", '#include <stdio.h>\nint hello(void) { return puts("hi"); }\n', "2.17")
    tag = platform_tag(lib, "libputs.so", GlibcTarget((2, 3), TARGET.location))
    assert glibc_needed(lib) <= (2, 3) and tag.tag == "manylinux_2_5_x86_64"


def test_a_library_that_needs_a_newer_glibc_is_refused_at_the_target_naming_the_symbols(tmp_path):
    lib = build_library(tmp_path, "threads", THREADS_AND_DLOPEN, "2.34", "-lpthread", "-ldl")
    assert glibc_needed(lib) == (2, 34)
    with pytest.raises(DiagnosticError) as info:
        platform_tag(lib, "libthreads.so", TARGET)
    (d,) = info.value.diagnostics
    assert d.rule == "GLIBC-TARGET" and d.location == TARGET.location
    assert "libthreads.so needs glibc 2.34" in d.message and "target glibc 2.28" in d.message
    assert "dlopen@GLIBC_2.34" in d.message and "pthread_create@GLIBC_2.34" in d.message
    assert d.facts["required"] == "2.34" and "puts@GLIBC_2.2.5" not in d.facts["symbols"]
    assert platform_tag(lib, "libthreads.so", GlibcTarget((2, 34), TARGET.location)).tag == "manylinux_2_34_x86_64"


def test_a_library_outside_glibc_is_refused(tmp_path):
    build_library(tmp_path, "helper", "int helper(void) { return 1; }\n", "2.28")
    lib = build_library(tmp_path, "user", "int helper(void);\nint use(void) { return helper(); }\n", "2.28",
                        f"-L{tmp_path}", "-lhelper")
    with pytest.raises(DiagnosticError) as info:
        platform_tag(lib, "libuser.so", TARGET)
    d = info.value.diagnostics[0]
    assert d.rule == "WHEEL-PLATFORM" and "libhelper.so" in d.message and d.location.file == "libuser.so"


def test_bytes_that_are_not_elf_are_refused():
    with pytest.raises(DiagnosticError, match="not a readable ELF shared library"):
        platform_tag(b"not an elf file at all", "junk.so", TARGET)
