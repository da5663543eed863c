"""Diagnostics: errors and warnings as values with an id, a location and a hint.

Every stage of the builder reports problems as :class:`Diagnostic` records and
never prints or exits; :class:`DiagnosticError` carries a batch of them up to
the CLI, which renders them once as text, JSON or GitHub annotations.
This module imports nothing from the rest of ``builder``.
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


JSON_KEYS = ("file", "line", "column", "rule", "severity", "message", "hint")


@dataclass(frozen=True)
class Diagnostic:
    """One finding. ``rule`` is a stable id such as ``SMEM-BUDGET``.

    ``facts`` holds the numbers that decided the outcome (the fact values and
    the computed quantities), so a reader can check the arithmetic.
    """

    rule: str
    message: str
    location: Location
    hint: str = ""
    severity: Severity = Severity.ERROR
    facts: Mapping[str, object] = field(default_factory=dict)

    def to_json(self) -> dict:
        """The ``--format json`` record: exactly the keys of :data:`JSON_KEYS`."""
        return {
            "file": self.location.file,
            "line": self.location.line,
            "column": self.location.column,
            "rule": self.rule,
            "severity": self.severity.value,
            "message": self.message,
            "hint": self.hint,
        }

    def to_text(self) -> str:
        where = f" [{self.location.path}]" if self.location.path else ""
        text = f"{self.location}: {self.severity.value}: {self.rule}: {self.message}{where}"
        if self.hint:
            text += f"\n    hint: {self.hint}"
        return text

    def to_github(self) -> str:
        level = {"error": "error", "warning": "warning", "note": "notice"}[self.severity.value]
        props = [f"file={self.location.file}"]
        if self.location.line is not None:
            props.append(f"line={self.location.line}")
        if self.location.column is not None:
            props.append(f"col={self.location.column}")
        props.append(f"title={self.rule}")
        body = self.message + (f" Hint: {self.hint}" if self.hint else "")
        return f"::{level} {','.join(props)}::{_github_escape(body)}"


def _github_escape(text: str) -> str:
    return text.replace("%", "%25").replace("\r", "%0D").replace("\n", "%0A")


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
    return (d.location.file, d.location.line or 0, d.location.column or 0, d.rule)


def render(diagnostics: Iterable[Diagnostic], fmt: str) -> str:
    """Render diagnostics as ``text``, ``json`` or ``github``."""
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
