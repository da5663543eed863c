"""Load JSON keeping the line and column of every value, as builder/load/yamlsrc.py does for YAML.

The tables committed under ``catalog/`` (tuning, verification) are JSON that
GPU machines write and people merge by hand. Every problem is a diagnostic
of the caller's rule id, never a traceback: a file that is too large or not
UTF-8 (builder/load/text.py), not JSON (at the line and column ``json``
reports), nested deeper than :data:`~builder.load.yamlsrc.MAX_DEPTH` (the
decoder recurses per level), a duplicate key (JSON keeps the last silently),
``NaN`` or ``Infinity`` (not JSON numbers), or an integer of more than
:data:`~builder.load.yamlsrc.MAX_INT_DIGITS` digits (Python's ``int()``
refuses 4,300).

Positions come from the standard library's pure-Python decoder, whose object
and array parsers are wrapped to record where each value starts (70 ms for
the 330 KB catalog/tuning/sm90a/h200.json).
"""

from __future__ import annotations

import bisect
import json
import json.decoder
import json.scanner
from dataclasses import replace
from pathlib import Path
from typing import Any

from builder.diagnostics import Diagnostic, DiagnosticError, Location
from builder.load.text import read_text
from builder.load.yamlsrc import MAX_DEPTH, MAX_INT_DIGITS, YamlDocument, YamlPath


# catalog/tuning/sm90a/h200.json is 330 KB; the json module reads 1 MiB in a fraction of a second.
MAX_FILE_BYTES = 1024 * 1024


def load_json(path: Path, display: str, rule: str) -> YamlDocument:
    """Parse ``path``; every problem raises :class:`DiagnosticError` with id ``rule``."""
    try:
        text = read_text(path, display, MAX_FILE_BYTES)
    except DiagnosticError as exc:
        raise DiagnosticError([replace(d, rule=rule) for d in exc.diagnostics]) from None
    return parse_json(text, display, rule)


class _Refused(ValueError):
    def __init__(self, index: int | None, message: str, hint: str):
        super().__init__(message)
        self.index, self.message, self.hint = index, message, hint


def _constant(name: str) -> None:
    raise _Refused(None, f"{name} is not a JSON number", "write a finite number")


def _integer(text: str) -> int:
    if len(text) > MAX_INT_DIGITS:
        raise _Refused(None, f"a number of {len(text)} digits", f"write a number of at most {MAX_INT_DIGITS} digits")
    return int(text)


class _Decoder(json.JSONDecoder):
    """A JSON decoder that records where each value of each object and array starts."""

    def __init__(self):
        super().__init__(object_pairs_hook=list, parse_constant=_constant, parse_int=_integer)
        self.parse_object, self.parse_array = self._object, self._array
        self.scan_once = json.scanner.py_make_scanner(self)
        self.starts: dict[int, dict] = {}  # id(dict or list) -> {key or index: start of its value}
        self.duplicates: list[tuple[int, str]] = []
        self.depth = 0

    def _object(self, s_and_end, strict, scan_once, object_hook, object_pairs_hook, memo=None):
        starts, scan = self._recording(scan_once, s_and_end[1])
        try:
            pairs, end = json.decoder.JSONObject(s_and_end, strict, scan, object_hook, object_pairs_hook, memo)
        finally:
            self.depth -= 1
        out: dict[str, Any] = {}
        where: dict[str, int] = {}
        for (key, value), start in zip(pairs, starts):
            if key in out:
                self.duplicates.append((start, key))
                continue
            out[key], where[key] = value, start
        self.starts[id(out)] = where
        return out, end

    def _array(self, s_and_end, scan_once):
        starts, scan = self._recording(scan_once, s_and_end[1])
        try:
            values, end = json.decoder.JSONArray(s_and_end, scan)
        finally:
            self.depth -= 1
        self.starts[id(values)] = dict(enumerate(starts))
        return values, end

    def _recording(self, scan_once, start: int):
        self.depth += 1
        if self.depth > MAX_DEPTH:
            raise _Refused(start - 1, f"values nest more than {MAX_DEPTH} levels deep",
                           "flatten the structure; these tables nest a few levels")
        starts: list[int] = []

        def scan(string: str, index: int):
            starts.append(index)
            try:
                return scan_once(string, index)
            except _Refused as exc:  # a constant or number refused above knows no position
                exc.index = index if exc.index is None else exc.index
                raise

        return starts, scan


def parse_json(text: str, name: str, rule: str) -> YamlDocument:
    lines = [0] + [i + 1 for i, c in enumerate(text) if c == "\n"]

    def position(index: int) -> tuple[int, int]:
        line = bisect.bisect_right(lines, index)
        return line, index - lines[line - 1] + 1

    decoder = _Decoder()
    try:
        data = decoder.decode(text)
    except _Refused as exc:
        start = exc.index if exc.index is not None else len(text) - len(text.lstrip())  # the document itself
        raise DiagnosticError([Diagnostic(rule, exc.message, Location(name, *position(start)), exc.hint)]) from None
    except json.JSONDecodeError as exc:
        raise DiagnosticError([Diagnostic(rule, f"not JSON: {exc.msg}", Location(name, exc.lineno, exc.colno),
                                          "fix the JSON here, or write the file again with the tool that made it")]) from None
    positions: dict[YamlPath, tuple[int, int]] = {(): (1, 1)}
    _place(data, (), decoder.starts, position, positions)
    if decoder.duplicates:
        raise DiagnosticError([Diagnostic(rule, f"duplicate key {key!r}", Location(name, *position(start)),
                                          "remove one of the two entries; JSON readers keep only the last")
                               for start, key in decoder.duplicates])
    return YamlDocument(name, data, positions)


def _place(value: Any, path: YamlPath, starts: dict, position, positions: dict) -> None:
    """Record the position of every value under ``value`` (at most MAX_DEPTH levels)."""
    if not isinstance(value, (dict, list)):
        return
    items = value.items() if isinstance(value, dict) else enumerate(value)
    where = starts.get(id(value), {})
    for key, child in items:
        if key in where:
            positions[path + (key,)] = position(where[key])
        _place(child, path + (key,), starts, position, positions)

