"""Load YAML keeping the line and column of every node.

PyYAML's constructors drop positions and silently keep the last of duplicate
keys. This loader composes the node tree itself, converts it to plain Python
values and records a :class:`~builder.diagnostics.Location` for every path
(a tuple of mapping keys and sequence indices), so later stages can point at
the exact line of a bad value. Syntax errors and duplicate keys become
diagnostics, never tracebacks.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from builder.diagnostics import Diagnostic, DiagnosticError, Location

YamlPath = tuple[str | int, ...]


@dataclass(frozen=True)
class YamlDocument:
    """Plain data plus the position of every node in the source file."""

    file: str
    data: Any
    positions: dict[YamlPath, tuple[int, int]]

    def locate(self, path: YamlPath) -> Location:
        """Location of the deepest existing node on ``path`` (1-based)."""
        probe = tuple(path)
        while probe and probe not in self.positions:
            probe = probe[:-1]
        line, column = self.positions.get(probe, (1, 1))
        return Location(self.file, line, column, format_path(path))


def format_path(path: YamlPath) -> str:
    out = ""
    for part in path:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out


def load_yaml(path: Path, display: str | None = None) -> YamlDocument:
    """Parse ``path``; raise :class:`DiagnosticError` for syntax errors and duplicate keys."""
    name = display or str(path)
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise DiagnosticError([Diagnostic("YAML-IO", f"cannot read file: {exc.strerror}",
                                          Location(name), "check the path and permissions")])
    return parse_yaml(text, name)


def parse_yaml(text: str, name: str) -> YamlDocument:
    try:
        node = yaml.compose(text, Loader=yaml.SafeLoader)
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        loc = Location(name, mark.line + 1, mark.column + 1) if mark else Location(name)
        problem = exc.problem or exc.context or "invalid YAML"
        raise DiagnosticError([Diagnostic("YAML-SYNTAX", f"YAML syntax error: {problem}", loc,
                                          "fix the indentation or quoting near this position")])
    positions: dict[YamlPath, tuple[int, int]] = {}
    problems: list[Diagnostic] = []
    data = _convert(node, (), positions, problems, name) if node is not None else None
    if problems:
        raise DiagnosticError(problems)
    return YamlDocument(name, data, positions)


def _convert(node: yaml.Node, path: YamlPath, positions: dict, problems: list, name: str) -> Any:
    positions[path] = (node.start_mark.line + 1, node.start_mark.column + 1)
    if isinstance(node, yaml.MappingNode):
        out: dict[str, Any] = {}
        for key_node, value_node in node.value:
            key = _scalar(key_node)
            if not isinstance(key, str):
                key = str(key)
            if key in out:
                first = positions[path + (key,)]
                problems.append(Diagnostic(
                    "YAML-DUPLICATE-KEY", f"duplicate key {key!r} (first defined at line {first[0]})",
                    Location(name, key_node.start_mark.line + 1, key_node.start_mark.column + 1,
                             format_path(path + (key,))),
                    "remove one of the two entries; YAML would silently keep only the last",
                    facts={"key": key, "first_line": first[0], "first_column": first[1]}))
                continue
            out[key] = _convert(value_node, path + (key,), positions, problems, name)
            positions[path + (key,)] = (key_node.start_mark.line + 1, key_node.start_mark.column + 1)
        return out
    if isinstance(node, yaml.SequenceNode):
        return [_convert(child, path + (i,), positions, problems, name) for i, child in enumerate(node.value)]
    return _scalar(node)


def _scalar(node: yaml.Node) -> Any:
    return yaml.constructor.SafeConstructor().construct_object(node, deep=True)
