"""Diagnostics: errors and warnings as values with an id, a subject, a location, a hint and facts.

Every stage of the builder reports problems as :class:`Diagnostic` records and
never prints or exits; :class:`DiagnosticError` carries a batch of them up to
the CLI, which renders them once as text, JSON or GitHub annotations. The
record stays a record to the end: the JSON output has every field (the
subject, the YAML path, the facts), and only the text output joins them into
a line. This module imports nothing from the rest of ``builder``.
"""

from __future__ import annotations

import difflib
import enum
import json
from dataclasses import dataclass, field
from typing import Iterable, Mapping


class Severity(str, enum.Enum):
    ERROR = "error"
    WARNING = "warning"
    NOTE = "note"


@dataclass(frozen=True)
class Location:
    """Where a problem is: file, 1-based line and column, and the YAML path."""

    file: str
    line: int | None = None
    column: int | None = None
    path: str = ""

    def __str__(self) -> str:
        parts = [self.file]
        if self.line is not None:
            parts.append(str(self.line))
            if self.column is not None:
                parts.append(str(self.column))
        return ":".join(parts)


JSON_KEYS = ("rule", "severity", "subject", "message", "hint", "location", "facts")
LOCATION_KEYS = ("file", "line", "column", "path")


@dataclass(frozen=True)
class Diagnostic:
    """One finding. ``rule`` is a stable id such as ``SMEM-BUDGET``.

    ``subject`` is the kernel id the finding is about, or None for a problem
    of a file as a whole; it is a field, never a prefix of ``message``.
    ``facts`` holds the numbers that decided the outcome (the fact values and
    the computed quantities), so a reader can check the arithmetic.
    Every field is a plain value, so a diagnostic pickles across processes.
    """

    rule: str
    message: str
    location: Location
    hint: str = ""
    severity: Severity = Severity.ERROR
    facts: Mapping[str, object] = field(default_factory=dict)
    subject: str | None = None

    def to_json(self) -> dict:
        """The ``--format json`` record: the keys of :data:`JSON_KEYS`, ``location`` with
        :data:`LOCATION_KEYS` (``path`` is the YAML path, e.g. ``kernels[3].tile``, or null)."""
        loc = self.location
        return {
            "rule": self.rule,
            "severity": self.severity.value,
            "subject": self.subject,
            "message": self.message,
            "hint": self.hint,
            "location": {"file": loc.file, "line": loc.line, "column": loc.column, "path": loc.path or None},
            "facts": _plain(dict(self.facts)),
        }

    def to_text(self) -> str:
        where = f" [{self.location.path}]" if self.location.path else ""
        subject = f"{self.subject}: " if self.subject else ""
        text = f"{self.location}: {self.severity.value}: {self.rule}: {subject}{self.message}{where}"
        if self.hint:
            text += f"\n    hint: {self.hint}"
        return text

    def to_github(self) -> str:
        """One workflow command line: ``::error file=F,line=L,col=C,title=RULE (subject)::message Hint: ...``.

        Properties and data are escaped as GitHub's runner unescapes them
        (actions/toolkit ``command.ts``), so a ``%`` or a line break in a
        file name or message never splits the annotation or ends it early.
        """
        level = {"error": "error", "warning": "warning", "note": "notice"}[self.severity.value]
        props = [f"file={_github_property(self.location.file)}"]
        if self.location.line is not None:
            props.append(f"line={self.location.line}")
        if self.location.column is not None:
            props.append(f"col={self.location.column}")
        title = f"{self.rule} ({self.subject})" if self.subject else self.rule
        props.append(f"title={_github_property(title)}")
        body = self.message + (f" Hint: {self.hint}" if self.hint else "")
        return f"::{level} {','.join(props)}::{_github_data(body)}"


def _github_data(text: str) -> str:
    return text.replace("%", "%25").replace("\r", "%0D").replace("\n", "%0A")


def _github_property(text: str) -> str:
    return _github_data(text).replace(":", "%3A").replace(",", "%2C")


def _plain(value: object) -> object:
    """``value`` as JSON data: enums by value, tuples and sets as lists, anything else unknown as text."""
    if isinstance(value, enum.Enum):
        return _plain(value.value)
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, Mapping):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (set, frozenset)):
        return sorted((_plain(v) for v in value), key=repr)
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return str(value)


class DiagnosticError(Exception):
    """Carries diagnostics from the stage that found them to the CLI."""

    def __init__(self, diagnostics: Iterable[Diagnostic]):
        self.diagnostics = tuple(diagnostics)
        super().__init__("\n".join(d.to_text() for d in self.diagnostics))

    def __reduce__(self):
        return (DiagnosticError, (self.diagnostics,))


def has_errors(diagnostics: Iterable[Diagnostic]) -> bool:
    return any(d.severity is Severity.ERROR for d in diagnostics)


def sort_key(d: Diagnostic) -> tuple:
    return (d.location.file, d.location.line or 0, d.location.column or 0, d.rule, d.subject or "")


def render(diagnostics: Iterable[Diagnostic], fmt: str) -> str:
    """Render diagnostics as ``text``, ``json`` (a list of :meth:`Diagnostic.to_json` records) or ``github``."""
    items = sorted(diagnostics, key=sort_key)
    if fmt == "json":
        return json.dumps([d.to_json() for d in items], indent=2)
    if fmt == "github":
        return "\n".join(d.to_github() for d in items)
    return "\n".join(d.to_text() for d in items)


def did_you_mean(word: object, choices: Iterable[str]) -> str | None:
    """The choice closest to ``word`` by difflib's ratio, ignoring case, or None if none is close.

    A diagnostic puts it in its hint; ids and messages stay as they are.
    """
    if not isinstance(word, str):
        return None
    by_folded = {c.casefold(): c for c in choices}
    found = difflib.get_close_matches(word.casefold(), list(by_folded), n=1)
    return by_folded[found[0]] if found else None
