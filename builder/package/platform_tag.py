"""The wheel platform tag of a bundle's shared library, and the check that it keeps its promise (PEP 600).

``manylinux_X_Y_<arch>`` promises that the wheel runs on any Linux whose
glibc is X.Y or newer. X.Y is the bundle's glibc target (``glibc`` in
``catalog/catalog.yaml``, recorded in the manifest as ``bundle.glibc``), the
version the library was linked for; the library is read to check it:

- the ELF machine gives the arch (``x86_64``, ``aarch64``);
- every ``DT_NEEDED`` entry must be part of glibc itself (libc, libm, libdl,
  librt, libpthread and the dynamic loader), which every manylinux system
  has; anything else is refused, since pip cannot check it;
- the highest ``GLIBC_x.y`` version in ``.gnu.version_r`` must not be newer
  than the target (GLIBC-TARGET, naming the symbols that need more);
  ``GLIBC_PRIVATE`` is refused: it binds to one glibc build.

pip generates no PEP 600 tag below glibc 2.5 on x86-64 and 2.17 on
aarch64 (``packaging/_manylinux.py``, ``too_old_glibc2``), so a lower target
is tagged at that floor, which the library satisfies all the same.

The tag is the target, not the library's own need, so it moves only when
the catalog moves it. Measured: ``libtilekiln_sm90a.so`` linked by zig for
glibc 2.28 needs ``GLIBC_2.17``; linked by Debian 12's gcc against glibc 2.36
it needed ``GLIBC_2.34``.
"""

from __future__ import annotations

import io
import re
from dataclasses import dataclass

from elftools.common.exceptions import ELFError
from elftools.elf.dynamic import DynamicSection
from elftools.elf.elffile import ELFFile
from elftools.elf.gnuversions import GNUVerNeedSection, GNUVerSymSection

from builder.diagnostics import Diagnostic, DiagnosticError, Location

# ELF e_machine -> (wheel arch, dynamic loader soname, lowest manylinux glibc pip knows).
MACHINES = {
    "EM_X86_64": ("x86_64", "ld-linux-x86-64.so.2", (2, 5)),
    "EM_AARCH64": ("aarch64", "ld-linux-aarch64.so.1", (2, 17)),
}
GLIBC_LIBRARIES = frozenset({"libc.so.6", "libm.so.6", "libdl.so.2", "librt.so.1", "libpthread.so.0"})
_GLIBC_VERSION = re.compile(r"GLIBC_(\d+)\.(\d+)(?:\.\d+)?")


@dataclass(frozen=True)
class GlibcTarget:
    """The oldest glibc a bundle promises to run on, and where that promise is written."""

    version: tuple[int, int]
    location: Location  # catalog.yaml's `glibc`, or a manifest's bundle.glibc

    @property
    def text(self) -> str:
        return f"{self.version[0]}.{self.version[1]}"


@dataclass(frozen=True)
class PlatformTag:
    arch: str
    glibc: tuple[int, int]  # the tag's glibc: max(target, floor)
    required: tuple[int, int]  # the highest GLIBC_x.y the library asks for
    needed: tuple[str, ...]

    @property
    def tag(self) -> str:
        return f"manylinux_{self.glibc[0]}_{self.glibc[1]}_{self.arch}"


def platform_tag(library: bytes, label: str, target: GlibcTarget) -> PlatformTag:
    """The manylinux tag of a shared library's bytes built for ``target``; ``label`` names it in errors.

    Raises ``DiagnosticError``: WHEEL-PLATFORM when no manylinux tag fits the
    library, GLIBC-TARGET (at ``target.location``) when it needs a newer glibc.
    """
    try:
        elf = ELFFile(io.BytesIO(library))
        machine = elf["e_machine"]
        needed = tuple(sorted(tag.needed for s in elf.iter_sections() if isinstance(s, DynamicSection)
                              for tag in s.iter_tags() if tag.entry.d_tag == "DT_NEEDED"))
        versions = [(aux.name, verneed.name, aux["vna_other"]) for s in elf.iter_sections()
                    if isinstance(s, GNUVerNeedSection) for verneed, auxes in s.iter_versions() for aux in auxes]
        users = _symbols_by_version(elf, {index: name for name, _, index in versions})
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
    for name, file, _ in versions:
        match = _GLIBC_VERSION.fullmatch(name)
        if match is None:
            raise _error(label, f"requires symbol version {name} of {file}, which no manylinux tag covers",
                         "link without it (GLIBC_PRIVATE binds to one glibc build)")
        required = max(required, (int(match.group(1)), int(match.group(2))))
    if required > target.version:
        raise _too_new(label, target, required, users)
    return PlatformTag(arch, max(target.version, floor), required, needed)


def _symbols_by_version(elf: ELFFile, names: dict[int, str]) -> dict[str, list[str]]:
    """Version name -> the undefined dynamic symbols bound to it; ``names`` maps version indices to names."""
    versym = next((s for s in elf.iter_sections() if isinstance(s, GNUVerSymSection)), None)
    dynsym = elf.get_section_by_name(".dynsym")
    if versym is None or dynsym is None:
        return {}
    users: dict[str, list[str]] = {}
    for index, symbol in enumerate(dynsym.iter_symbols()):
        version = names.get(versym.get_symbol(index)["ndx"])
        if symbol["st_shndx"] == "SHN_UNDEF" and version is not None:
            users.setdefault(version, []).append(symbol.name)
    return users


def _too_new(label: str, target: GlibcTarget, required: tuple[int, int],
             users: dict[str, list[str]]) -> DiagnosticError:
    symbols = sorted(f"{s}@{name}" for name, names in users.items() if (m := _GLIBC_VERSION.fullmatch(name))
                     and (int(m.group(1)), int(m.group(2))) > target.version for s in names)
    shown = ", ".join(symbols[:8]) + (f" and {len(symbols) - 8} more" if len(symbols) > 8 else "")
    return DiagnosticError([Diagnostic(
        "GLIBC-TARGET", f"the library {label} needs glibc {required[0]}.{required[1]} ({shown}), newer than "
        f"the target glibc {target.text} its wheel would promise", target.location,
        "rebuild with the pinned zig (builder/package/link.py), which links against the target's symbol versions, "
        "or raise `glibc` in catalog/catalog.yaml, which leaves systems older than that out",
        facts={"target": target.text, "required": f"{required[0]}.{required[1]}", "symbols": symbols})])


def _error(label: str, problem: str, hint: str) -> DiagnosticError:
    return DiagnosticError([Diagnostic("WHEEL-PLATFORM", f"the library {problem}", Location(label), hint)])
