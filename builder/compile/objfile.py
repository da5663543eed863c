"""Read what the build needs out of an exported CuTe DSL object file.

``export_to_c`` writes an x86-64 ELF object holding the host launch code and
the device code as a fatbin in the local symbol ``kernels_binary``. This
module finds the entry points (``_mlir_<prefix>_cuda_init``,
``..._cuda_load_to_device`` and the ``..._mlir_ciface_...`` launcher) and
unpacks the fatbin into its cubins. The fatbin container is a 16-byte header
(magic 0xBA55ED50, version, header size, payload size) followed by entries,
each with its own header giving kind (2 = ELF cubin, 1 = PTX) and sizes;
compressed entries are refused, since ``cuobjdump`` and the manifest need the
plain cubin.
"""

from __future__ import annotations

import io
import struct
from dataclasses import dataclass

from elftools.elf.elffile import ELFFile
from elftools.elf.sections import SymbolTableSection

FATBIN_MAGIC = 0xBA55ED50
_ENTRY_ELF = 2
_FLAG_COMPRESSED = 0x2000


class ObjectFormatError(ValueError):
    """The object does not look like a CuTe DSL export."""


@dataclass(frozen=True)
class EntryPoints:
    prefix: str
    init: str
    load_to_device: str
    launch: str


def _symbols(data: bytes) -> dict[str, tuple[int, int, int]]:
    """name -> (section index, value, size) of every defined symbol."""
    elf = ELFFile(io.BytesIO(data))
    out = {}
    for section in elf.iter_sections():
        if isinstance(section, SymbolTableSection):
            for sym in section.iter_symbols():
                shndx = sym["st_shndx"]
                if isinstance(shndx, int):
                    out[sym.name] = (shndx, sym["st_value"], sym["st_size"])
    return out


def entry_points(data: bytes, prefix: str) -> EntryPoints:
    syms = _symbols(data)
    init, load = f"_mlir_{prefix}_cuda_init", f"_mlir_{prefix}_cuda_load_to_device"
    launch = [s for s in syms if s.startswith(f"_mlir_{prefix}__mlir_ciface_")]
    missing = [s for s in (init, load) if s not in syms]
    if missing or len(launch) != 1:
        raise ObjectFormatError(f"object for prefix {prefix!r} lacks its entry points "
                                f"(missing {missing}, launchers found: {len(launch)})")
    return EntryPoints(prefix, init, load, launch[0])


def fatbin(data: bytes) -> bytes:
    syms = _symbols(data)
    if "kernels_binary" not in syms:
        raise ObjectFormatError("object has no kernels_binary symbol (no device code)")
    shndx, value, size = syms["kernels_binary"]
    elf = ELFFile(io.BytesIO(data))
    section = elf.get_section(shndx)
    blob = section.data()[value:value + size]
    if len(blob) < 16 or struct.unpack_from("<I", blob)[0] != FATBIN_MAGIC:
        raise ObjectFormatError("kernels_binary is not a fatbin")
    return blob


def cubins(fat: bytes) -> list[bytes]:
    """The plain ELF cubins inside a fatbin."""
    _, _, header_size, payload = struct.unpack_from("<IHHQ", fat, 0)
    offset, end, out = header_size, header_size + payload, []
    while offset < end:
        kind, _version, entry_header, padded = struct.unpack_from("<HHII", fat, offset)
        flags = struct.unpack_from("<Q", fat, offset + 48)[0] if entry_header >= 56 else 0
        body = fat[offset + entry_header: offset + entry_header + padded]
        if kind == _ENTRY_ELF:
            if flags & _FLAG_COMPRESSED or body[:4] != b"\x7fELF":
                raise ObjectFormatError("fatbin entry is compressed; build without fatbin compression")
            out.append(_trim_elf(body))
        offset += entry_header + padded
    if not out:
        raise ObjectFormatError("fatbin holds no cubin")
    return out


def _trim_elf(body: bytes) -> bytes:
    """Drop the container's padding after the ELF image."""
    elf = ELFFile(io.BytesIO(body))
    h = elf.header
    end = max(h["e_shoff"] + h["e_shnum"] * h["e_shentsize"], h["e_phoff"] + h["e_phnum"] * h["e_phentsize"])
    for section in elf.iter_sections():
        if section["sh_type"] != "SHT_NOBITS":
            end = max(end, section["sh_offset"] + section["sh_size"])
    return body[:end]
