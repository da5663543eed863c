"""The manylinux tag follows the glibc symbol versions a library needs (tiny libraries built with gcc).

The expected glibc version is read independently of the code under test: a
shared library that defines no versions of its own names exactly the versions
it needs in its string table, so a regex over the bytes finds them.
"""

from __future__ import annotations

import platform
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from builder.diagnostics import DiagnosticError
from builder.platform_tag import platform_tag

pytestmark = pytest.mark.skipif(shutil.which("gcc") is None or platform.machine() != "x86_64",
                                reason="needs gcc on x86-64 Linux")


def build_library(tmp_path: Path, name: str, source: str, *flags: str) -> bytes:
    (tmp_path / f"{name}.c").write_text(source)
    out = tmp_path / f"lib{name}.so"
    subprocess.run(["gcc", "-shared", "-fPIC", "-o", str(out), str(tmp_path / f"{name}.c"), *flags],
                   check=True, cwd=tmp_path)
    return out.read_bytes()


def glibc_needed(library: bytes) -> tuple[int, int]:
    found = [(int(a), int(b)) for a, b in re.findall(rb"GLIBC_(\d+)\.(\d+)", library)]
    assert found, "the library names no glibc version"
    return max(found)


def test_old_symbols_only_get_the_lowest_tag_pip_knows(tmp_path):
    lib = build_library(tmp_path, "puts", '#include <stdio.h>\nint hello(void) { return puts("hi"); }\n')
    tag = platform_tag(lib, "libputs.so")
    assert tag.required == glibc_needed(lib)
    assert tag.required < (2, 5)
    assert tag.tag == "manylinux_2_5_x86_64"


def test_tag_is_the_highest_glibc_version_required(tmp_path):
    # On glibc >= 2.34 dlopen is versioned GLIBC_2.34 (libdl merged into libc); older hosts give 2.2.5.
    lib = build_library(tmp_path, "dl", "#include <dlfcn.h>\nvoid *open_it(void) { return dlopen(\"x\", 1); }\n",
                        "-ldl")
    tag = platform_tag(lib, "libdl-user.so")
    needed = glibc_needed(lib)
    assert tag.required == needed
    assert tag.tag == f"manylinux_{max(needed, (2, 5))[0]}_{max(needed, (2, 5))[1]}_x86_64"
    assert "libc.so.6" in tag.needed


def test_a_library_outside_glibc_is_refused(tmp_path):
    build_library(tmp_path, "helper", "int helper(void) { return 1; }\n")
    lib = build_library(tmp_path, "user", "int helper(void);\nint use(void) { return helper(); }\n",
                        f"-L{tmp_path}", "-lhelper")
    with pytest.raises(DiagnosticError) as info:
        platform_tag(lib, "libuser.so")
    d = info.value.diagnostics[0]
    assert d.rule == "WHEEL-PLATFORM" and "libhelper.so" in d.message and d.location.file == "libuser.so"


def test_bytes_that_are_not_elf_are_refused():
    with pytest.raises(DiagnosticError, match="not a readable ELF shared library"):
        platform_tag(b"not an elf file at all", "junk.so")
