"""Read a project file (YAML or JSON) as text: bounded in size, strictly UTF-8, problems located.

Python's lenient readers would take a Latin-1 or UTF-16 file apart into
something else, or raise ``UnicodeDecodeError`` with a byte offset; here a
file that is not UTF-8 is a YAML-ENCODING diagnostic at the line and column
of its first bad byte, with a hint that names the likely encoding. A file
larger than the caller's bound is refused before it is parsed (YAML-LIMIT):
PyYAML reads about 100 KB/s in pure Python, so the bound keeps any input
inside a few seconds. Imports nothing from the rest of ``builder`` but
diagnostics.
"""

from __future__ import annotations

import stat
from pathlib import Path

from builder.diagnostics import Diagnostic, DiagnosticError, Location

_BOMS = {b"\xff\xfe": "UTF-16 (little-endian)", b"\xfe\xff": "UTF-16 (big-endian)"}


def read_text(path: Path, display: str, limit: int) -> str:
    """The text of ``path``, at most ``limit`` bytes; raises :class:`DiagnosticError`
    (YAML-IO, YAML-LIMIT, YAML-ENCODING)."""
    try:
        # Opening a FIFO would wait for a writer forever, and a device may never end.
        if not stat.S_ISREG(path.stat().st_mode):
            raise DiagnosticError([Diagnostic("YAML-IO", "not a regular file (a directory, FIFO or device)",
                                              Location(display), "replace it with the file itself")])
        with path.open("rb") as stream:
            data = stream.read(limit + 1)
    except OSError as exc:
        raise DiagnosticError([Diagnostic("YAML-IO", f"cannot read file: {exc.strerror}",
                                          Location(display), "check the path and permissions")]) from None
    if len(data) > limit:
        raise DiagnosticError([Diagnostic(
            "YAML-LIMIT", f"file is larger than {limit // 1024} KiB", Location(display),
            "check it is the right file; a catalog may be split into several files under catalog/gemm/",
            facts={"limit_bytes": limit})])
    return decode_text(data, display)


def decode_text(data: bytes, display: str) -> str:
    """``data`` decoded as UTF-8 (a leading byte-order mark dropped); raises YAML-ENCODING at the first bad byte."""
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        line, column = byte_position(data, exc.start)
        encoding = next((name for bom, name in _BOMS.items() if data.startswith(bom)), None)
        hint = (f"the file is {encoding}; save it as UTF-8" if encoding else
                "save the file as UTF-8; a byte like this one comes from Latin-1 or another 8-bit encoding, "
                "or the file is not text")
        raise DiagnosticError([Diagnostic(
            "YAML-ENCODING", f"not UTF-8: byte 0x{data[exc.start]:02x} at offset {exc.start} ({exc.reason})",
            Location(display, line, column), hint,
            facts={"offset": exc.start, "byte": data[exc.start], "encoding": encoding})]) from None


def byte_position(data: bytes, offset: int) -> tuple[int, int]:
    """1-based (line, column in characters) of byte ``offset``, all of whose preceding bytes are UTF-8."""
    start = data.rfind(b"\n", 0, offset) + 1
    return data.count(b"\n", 0, offset) + 1, len(data[start:offset].decode("utf-8", "replace")) + 1


def text_position(text: str, index: int) -> tuple[int, int]:
    """1-based (line, column) of character ``index`` of ``text``."""
    return text.count("\n", 0, index) + 1, index - text.rfind("\n", 0, index)
