"""Load YAML keeping the line and column of every node, and refuse what is not plain data.

PyYAML's constructors drop positions and silently keep the last of duplicate
keys. This loader composes the node tree itself, converts it to plain Python
values and records a :class:`~builder.diagnostics.Location` for every path
(a tuple of mapping keys and sequence indices), so later stages can point at
the exact line of a bad value. Every problem is a located diagnostic, never
a traceback or a hang:

- YAML-SYNTAX: a syntax error, at the line to fix: where an unclosed quote
  or bracket opened, not the end of the file where the parser noticed;
  duplicate keys are YAML-DUPLICATE-KEY.
- YAML-ENCODING: a file that is not UTF-8 (builder/load/text.py), a
  character YAML does not allow (NUL, other control characters), or a
  string that holds a control character through an escape (``"\\e[31m"``),
  which would reach a terminal through a diagnostic.
- YAML-TAG: an explicit tag that is not plain data (``!!python/name:...``,
  ``!!binary``, a custom ``!tag``), or a value its tag cannot read
  (``!!int abc``). Only strings, integers, floats, booleans, null, lists and
  mappings are read; dates and merge keys (``<<``) are plain strings, as in
  YAML 1.2 and in the JSON Schema the editor checks against.
- YAML-LIMIT: a file over the size bound, nesting deeper than
  :data:`MAX_DEPTH` (PyYAML composes recursively, so thousands of levels
  would overflow the stack), more than :data:`MAX_NODES` nodes once aliases
  are expanded (a "billion laughs" document is a few hundred bytes whose
  expansion never ends), an alias inside the node it names, or an integer
  of more than :data:`MAX_INT_DIGITS` digits.

The limits are checked while the document is composed, before anything
grows: the depth before descending, the expanded size at every alias.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from builder.diagnostics import Diagnostic, DiagnosticError, Location
from builder.load.text import read_text, text_position

YamlPath = tuple[str | int, ...]

# The files of catalog/ and templates/ nest at most 8 levels (a facts file's dtype combos); PyYAML takes
# about 3 Python frames per level, so 64 levels stay far inside the interpreter's 1000.
MAX_DEPTH = 64
# The largest file today has 1,185 nodes (catalog/gemm/sm90.yaml); 100,000 values expanded
# from aliases are composed and converted in about 0.1 s.
MAX_NODES = 100_000
# The largest file today is 15 KB (catalog/gemm/sm90.yaml); PyYAML reads 128 KiB in about 1.3 s.
MAX_FILE_BYTES = 128 * 1024
# No count in a catalog has more than 10 digits; Python's int() refuses 4,300 (CVE-2020-10735).
MAX_INT_DIGITS = 64

_TAG = "tag:yaml.org,2002:"
DATA_TAGS = frozenset(_TAG + t for t in ("str", "int", "float", "bool", "null", "seq", "map"))
_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")


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
    """Parse ``path``; raise :class:`DiagnosticError` for any problem listed in the module docstring."""
    name = display or str(path)
    return parse_yaml(read_text(path, name, MAX_FILE_BYTES), name)


class _Limit(Exception):
    def __init__(self, mark: yaml.Mark, message: str, hint: str, facts: dict):
        super().__init__(message)
        self.mark, self.message, self.hint, self.facts = mark, message, hint, facts


class _Loader(yaml.SafeLoader):
    """SafeLoader that resolves only plain data implicitly and bounds depth and alias expansion."""

    yaml_implicit_resolvers = {
        first: [(tag, rx) for tag, rx in resolvers if tag in DATA_TAGS]
        for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()}

    def __init__(self, text: str):
        super().__init__(text)
        self._depth = 0  # nesting level of the node being composed
        self._reached = 0  # deepest level reached inside it, aliases expanded
        self._nodes = 0  # nodes composed so far, each alias counted as the nodes it names
        self._extent: dict[int, tuple[int, int]] = {}  # id(anchored node) -> (nodes, levels)
        self._open: set[str] = set()  # anchors whose node is still being composed

    def compose_node(self, parent, index):
        event = self.peek_event()
        if isinstance(event, yaml.AliasEvent):
            if event.anchor in self._open:
                raise _Limit(event.start_mark, f"alias *{event.anchor} refers to a node that contains it",
                             "write the value out; a recursive structure has no end", {"anchor": event.anchor})
            node = super().compose_node(parent, index)
            nodes, levels = self._extent[id(node)]
            self._count(nodes, event.start_mark)
            self._reach(self._depth + levels, event.start_mark)
            return node
        self._reach(self._depth + 1, event.start_mark)
        self._depth += 1
        before, outer, self._reached = self._nodes, self._reached, self._depth
        if event.anchor is not None:
            self._open.add(event.anchor)
        node = super().compose_node(parent, index)
        self._open.discard(event.anchor)
        self._count(1, event.start_mark)
        if event.anchor is not None:
            self._extent[id(node)] = (self._nodes - before, self._reached - self._depth + 1)
        self._reached = max(outer, self._reached)
        self._depth -= 1
        return node

    def fetch_flow_collection_start(self, token_class):
        # Checked as the scanner opens each bracket: it looks up to 1024 characters ahead
        # for a possible key at every open level, seconds on one line of thousands of [.
        self._reach(self.flow_level + 1, self.get_mark(), track=False)
        super().fetch_flow_collection_start(token_class)

    def _reach(self, level: int, mark: yaml.Mark, track: bool = True) -> None:
        if level > MAX_DEPTH:
            raise _Limit(mark, f"values nest more than {MAX_DEPTH} levels deep",
                         "flatten the structure; catalog files nest a few levels", {"limit_depth": MAX_DEPTH})
        if track:
            self._reached = max(self._reached, level)

    def _count(self, nodes: int, mark: yaml.Mark) -> None:
        self._nodes += nodes
        if self._nodes > MAX_NODES:
            raise _Limit(mark, f"the document expands to more than {MAX_NODES:,} values here "
                         "(aliases count as the values they name)",
                         "write fewer values, or fewer aliases of large anchors; "
                         "a catalog needs neither many thousands of values nor nested aliases",
                         {"limit_nodes": MAX_NODES})


def parse_yaml(text: str, name: str) -> YamlDocument:
    try:
        loader = _Loader(text)
        try:
            node = loader.get_single_node()
        finally:
            loader.dispose()
    except yaml.reader.ReaderError as exc:
        line, column = text_position(text, exc.position)
        code = f"U+{exc.character if isinstance(exc.character, int) else ord(exc.character):04X}"
        raise DiagnosticError([Diagnostic(
            "YAML-ENCODING", f"character {code} is not allowed in YAML", Location(name, line, column),
            "remove it; a NUL or control character means the file is binary, or not UTF-8 text",
            facts={"character": code})]) from None
    except yaml.MarkedYAMLError as exc:
        raise DiagnosticError([_syntax(exc, text, name)]) from None
    except _Limit as exc:
        raise DiagnosticError([Diagnostic("YAML-LIMIT", exc.message, _at(name, exc.mark), exc.hint,
                                          facts=exc.facts)]) from None
    positions: dict[YamlPath, tuple[int, int]] = {}
    problems: list[Diagnostic] = []
    data = _Converter(name, positions, problems).convert(node, ()) if node is not None else None
    if problems:
        raise DiagnosticError(problems)
    return YamlDocument(name, data, positions)


def _at(name: str, mark: yaml.Mark | None, path: YamlPath = ()) -> Location:
    return Location(name, mark.line + 1, mark.column + 1, format_path(path)) if mark else Location(name)


def _syntax(exc: yaml.MarkedYAMLError, text: str, name: str) -> Diagnostic:
    """YAML-SYNTAX at the line to fix: where an unfinished construct (a quote, a bracket) began
    when the parser ran into the end of the file looking for its end, else where it stopped."""
    mark, context = exc.problem_mark, exc.context_mark
    problem = exc.problem or "invalid YAML"
    if exc.context and context is not None:
        problem = f"{exc.context} (line {context.line + 1}): {problem}"
    unfinished = context is not None and (mark is None or mark.index >= len(text))
    if unfinished or mark is None:
        mark = context
    hint = ("close the quote or bracket that starts here" if unfinished else
            "fix the indentation or quoting near this position")
    facts = {"end_of_file_line": text.count("\n") + 1} if unfinished else {}
    return Diagnostic("YAML-SYNTAX", f"YAML syntax error: {problem}", _at(name, mark), hint, facts=facts)


class _Converter:
    """Plain values of a composed node tree, with the position of every path."""

    def __init__(self, name: str, positions: dict, problems: list[Diagnostic]):
        self.name, self.positions, self.problems = name, positions, problems
        self.constructor = yaml.constructor.SafeConstructor()

    def convert(self, node: yaml.Node, path: YamlPath) -> Any:
        self.positions[path] = (node.start_mark.line + 1, node.start_mark.column + 1)
        if node.tag not in DATA_TAGS:
            return self._refuse_tag(node, path)
        if isinstance(node, yaml.MappingNode):
            return self._mapping(node, path)
        if isinstance(node, yaml.SequenceNode):
            return [self.convert(child, path + (i,)) for i, child in enumerate(node.value)]
        return self._scalar(node, path)

    def _mapping(self, node: yaml.MappingNode, path: YamlPath) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for key_node, value_node in node.value:
            if not isinstance(key_node, yaml.ScalarNode) or key_node.tag not in DATA_TAGS:
                self._problem("YAML-SYNTAX", "a mapping key must be a plain name or number", key_node, path,
                              "write the key as a plain word; complex and tagged keys are not read")
                continue
            key = self._scalar(key_node, path)
            key = key if isinstance(key, str) else str(key)
            here = (key_node.start_mark.line + 1, key_node.start_mark.column + 1)
            if key in out:
                first = self.positions[path + (key,)]
                self.problems.append(Diagnostic(
                    "YAML-DUPLICATE-KEY", f"duplicate key {key!r} (first defined at line {first[0]})",
                    Location(self.name, *here, format_path(path + (key,))),
                    "remove one of the two entries; YAML would silently keep only the last",
                    facts={"key": key, "first_line": first[0], "first_column": first[1]}))
                continue
            out[key] = self.convert(value_node, path + (key,))
            self.positions[path + (key,)] = here
        return out

    def _scalar(self, node: yaml.ScalarNode, path: YamlPath) -> Any:
        if node.tag == _TAG + "int" and len(node.value) > MAX_INT_DIGITS:
            return self._problem("YAML-LIMIT", f"a number of {len(node.value)} characters", node, path,
                                 "write a number of at most 64 digits", limit_digits=MAX_INT_DIGITS)
        try:
            value = self.constructor.construct_object(node)
        except (yaml.YAMLError, ValueError, KeyError) as exc:
            return self._problem("YAML-TAG", f"cannot read {node.value!r} as {_short(node.tag)} ({exc})", node,
                                 path, "write a value of that type, or drop the tag", tag=node.tag)
        if isinstance(value, str) and (bad := _CONTROL.search(value)):
            return self._problem("YAML-ENCODING", f"the string holds the control character "
                                 f"U+{ord(bad.group()):04X}", node, path,
                                 "remove it; an escape such as \\e or \\x1b makes one, and text needs none",
                                 character=f"U+{ord(bad.group()):04X}")
        return value

    def _refuse_tag(self, node: yaml.Node, path: YamlPath) -> None:
        return self._problem("YAML-TAG", f"tag {_short(node.tag)} is not plain data", node, path,
                             "remove the tag; only strings, numbers, booleans, null, lists and mappings are read",
                             tag=node.tag)

    def _problem(self, rule: str, message: str, node: yaml.Node, path: YamlPath, hint: str, **facts) -> None:
        self.problems.append(Diagnostic(rule, message, _at(self.name, node.start_mark, path), hint, facts=facts))
        return None


def _short(tag: str) -> str:
    return "!!" + tag.removeprefix(_TAG) if tag.startswith(_TAG) else tag
