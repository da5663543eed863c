"""The wheel platform tag a bundle's shared library can honestly carry (PEP 600).

``manylinux_X_Y_<arch>`` promises that the wheel runs on any Linux whose
glibc is X.Y or newer. The tag is read from the library, not from the build
host:

- the ELF machine gives the arch (``x86_64``, ``aarch64``);
- every ``DT_NEEDED`` entry must be part of glibc itself (libc, libm, libdl,
  librt, libpthread and the dynamic loader), which every manylinux system
  has; anything else is refused, since pip cannot check it;
- the highest ``GLIBC_x.y`` version in ``.gnu.version_r`` is X.Y.
  ``GLIBC_PRIVATE`` is refused: it binds to one glibc build.

pip generates no PEP 600 tag below glibc 2.5 on x86-64 and 2.17 on
aarch64 (``packaging/_manylinux.py``, ``too_old_glibc2``), so a library that
needs less is tagged at that floor, which it satisfies all the same.

Measured: ``libtilekiln_sm90a.so`` linked on Debian 12 (glibc 2.36) needs
``GLIBC_2.34``: glibc 2.34 moved the pthread, semaphore and dl* symbols the
static CUDA runtime calls into libc under that version, so a library linked
against 2.34 or newer can only be ``manylinux_2_34``. A wider tag needs a link
on an older glibc, not a different label.
"""

from __future__ import annotations

import io
import re
from dataclasses import dataclass

from elftools.common.exceptions import ELFError
from elftools.elf.dynamic import DynamicSection
from elftools.elf.elffile import ELFFile
from elftools.elf.gnuversions import GNUVerNeedSection

from builder.diagnostics import Diagnostic, DiagnosticError, Location

# ELF e_machine -> (wheel arch, dynamic loader soname, lowest manylinux glibc pip knows).
MACHINES = {
    "EM_X86_64": ("x86_64", "ld-linux-x86-64.so.2", (2, 5)),
    "EM_AARCH64": ("aarch64", "ld-linux-aarch64.so.1", (2, 17)),
}
GLIBC_LIBRARIES = frozenset({"libc.so.6", "libm.so.6", "libdl.so.2", "librt.so.1", "libpthread.so.0"})
_GLIBC_VERSION = re.compile(r"GLIBC_(\d+)\.(\d+)(?:\.\d+)?")


@dataclass(frozen=True)
class PlatformTag:
    arch: str
    glibc: tuple[int, int]  # the tag's glibc: max(required, floor)
    required: tuple[int, int]  # the highest GLIBC_x.y the library asks for
    needed: tuple[str, ...]

    @property
    def tag(self) -> str:
        return f"manylinux_{self.glibc[0]}_{self.glibc[1]}_{self.arch}"


def platform_tag(library: bytes, label: str) -> PlatformTag:
    """The manylinux tag of a shared library's bytes; ``label`` names it in errors."""
    try:
        elf = ELFFile(io.BytesIO(library))
        machine = elf["e_machine"]
        needed = tuple(sorted(tag.needed for s in elf.iter_sections() if isinstance(s, DynamicSection)
                              for tag in s.iter_tags() if tag.entry.d_tag == "DT_NEEDED"))
        versions = [(verneed.name, aux.name) for s in elf.iter_sections() if isinstance(s, GNUVerNeedSection)
                    for verneed, auxes in s.iter_versions() for aux in auxes]
    except ELFError as exc:
        raise _error(label, f"is not a readable ELF shared library ({exc})", "rebuild the bundle") from None
    if machine not in MACHINES:
        raise _error(label, f"is built for {machine}, which has no manylinux tag here",
                     f"build for one of: {', '.join(arch for arch, _, _ in MACHINES.values())}")
    arch, loader, floor = MACHINES[machine]
    allowed = GLIBC_LIBRARIES | {loader}
    foreign = [n for n in needed if n not in allowed]
    if foreign:
        raise _error(label, f"needs {', '.join(foreign)}, which is not part of glibc, so no manylinux tag "
                            "can promise it", "link it statically or drop the dependency (only libc may remain)")
    required = (2, 0)
    for file, name in versions:
        match = _GLIBC_VERSION.fullmatch(name)
        if match is None:
            raise _error(label, f"requires symbol version {name} of {file}, which no manylinux tag covers",
                         "link without it (GLIBC_PRIVATE binds to one glibc build)")
        required = max(required, (int(match.group(1)), int(match.group(2))))
    return PlatformTag(arch, max(required, floor), required, needed)


def _error(label: str, problem: str, hint: str) -> DiagnosticError:
    return DiagnosticError([Diagnostic("WHEEL-PLATFORM", f"the library {problem}", Location(label), hint)])
