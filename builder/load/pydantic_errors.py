"""Turn pydantic ``ValidationError`` entries into located diagnostics.

pydantic reports a ``loc`` path into the data; the YAML document maps that
path back to a line and column. Union and tagged-model internals that pydantic
inserts into ``loc`` (type names, discriminator tags such as ``tcgen05``,
``function-after`` steps) are dropped by walking the path through the data:
an element is kept when the data has it there, or when it is the last one
(the name of a missing key). The errors of one value (one per member of a
union such as ``stages: int | auto``) become one diagnostic.

The hint says what to write instead: the closest known key or value for a
misspelling (walking the model's types along the same path), and the
accepted spelling of a number or boolean of the wrong YAML type.
"""

from __future__ import annotations

import enum
import re
import types
from typing import Annotated, Literal, Union, get_args, get_origin

from pydantic import BaseModel, ValidationError

from builder.diagnostics import Diagnostic, did_you_mean
from builder.load.yamlsrc import YamlDocument

_HINTS = {
    "extra_forbidden": "remove the key or fix its spelling; unknown keys are rejected",
    "missing": "add the required key",
    "enum": "use one of the listed values",
    "literal_error": "use one of the listed values",
    "int_type": "write a whole number",
    "int_parsing": "write a whole number",
    "bool_type": "write true or false",
    "list_type": "write a YAML list, e.g. [1, 2]",
    "tuple_type": "write a YAML list, e.g. [1, 2]",
    "string_pattern_mismatch": "write it in the form of the pattern, with ASCII digits 0-9",
}


def diagnostics_from_validation(exc: ValidationError, doc: YamlDocument, rule: str,
                                model: type[BaseModel]) -> list[Diagnostic]:
    by_path: dict[tuple, list[dict]] = {}
    for err in exc.errors(include_url=False):
        loc = err["loc"]
        if err["type"] == "union_tag_invalid":  # at the tag's own line, not its mapping's
            loc = (*loc, err["ctx"]["discriminator"].strip("'"))
        by_path.setdefault(_data_path(loc, doc.data), []).append(err)
    return [_diagnostic(path, errors, doc, rule, model) for path, errors in by_path.items()]


def _diagnostic(path: tuple, errors: list[dict], doc: YamlDocument, rule: str,
                model: type[BaseModel]) -> Diagnostic:
    found = [_explain(err, path, doc.data, model) for err in errors]
    messages = list(dict.fromkeys(message for message, _, _ in found))
    prefix = "Input should be "
    if len(messages) > 1 and all(m.startswith(prefix) for m in messages):
        # One value that fits no member of a union: "Input should be a valid integer or 'auto'".
        messages = [prefix + " or ".join(m.removeprefix(prefix) for m in messages)]
    message = "; ".join(messages)
    value = errors[0].get("input")
    if errors[0]["type"] not in ("missing", "extra_forbidden") and not isinstance(value, (dict, list)):
        message = f"{message} (got {value!r})"
    # Of a union's hints the most specific one: a close spelling, then the accepted form of a number or boolean.
    suggested = [(hint, close) for _, hint, close in found if close]
    typed = [hint for (_, hint, _), err in zip(found, errors) if err["type"] in ("int_type", "bool_type")]
    facts = _facts(errors, value)
    if suggested:
        return Diagnostic(rule, message, doc.locate(path), suggested[0][0],
                          facts=facts | {"did_you_mean": suggested[0][1]})
    hint = typed[0] if typed else "; ".join(dict.fromkeys(hint for _, hint, _ in found if hint))
    return Diagnostic(rule, message, doc.locate(path), hint, facts=facts)


def _facts(errors: list[dict], value: object) -> dict[str, object]:
    """What pydantic decided on: its error types (stable ids such as ``int_type``), the scalar
    input it rejected and the values its message was rendered from (``ctx``: ``expected``,
    ``pattern``, limits such as ``ge``), less a model check's exception object."""
    facts: dict[str, object] = {"pydantic_types": list(dict.fromkeys(err["type"] for err in errors))}
    if errors[0]["type"] not in ("missing", "extra_forbidden") and not isinstance(value, (dict, list)):
        facts["input"] = value
    for err in errors:
        facts |= {k: v for k, v in (err.get("ctx") or {}).items() if k != "error" and k not in facts}
    return facts


def _explain(err: dict, path: tuple, data: object, model: type[BaseModel]) -> tuple[str, str, str | None]:
    """(message, hint, suggested spelling or None) of one pydantic error at data ``path``."""
    kind, value = err["type"], err.get("input")
    if kind == "value_error":
        # A model's own check raises ValueError("what is wrong; how to fix it").
        message, _, hint = str(err["ctx"]["error"]).partition("; ")
        return message, hint, None
    if kind == "extra_forbidden":
        known = [name for tp in _types_at(model, path[:-1], data) if _is_model(tp) for name in tp.model_fields]
        close = did_you_mean(path[-1], known)
        hint = f"did you mean {close!r}? unknown keys are rejected" if close else _HINTS[kind]
        return f"unknown key {path[-1]!r}", hint, close
    if kind == "missing":
        return f"missing required key {path[-1]!r}", _HINTS[kind], None
    if kind in ("enum", "literal_error"):
        close = did_you_mean(value, _choices(_types_at(model, path, data)))
        return err["msg"], f"did you mean {close!r}?" if close else _HINTS[kind], close
    return err["msg"], _scalar_hint(kind, value), None


def _scalar_hint(kind: str, value: object) -> str:
    """How to write ``value`` as the JSON Schema's integer or boolean."""
    if kind == "int_type":
        if isinstance(value, bool):
            return "write a whole number; true and false are booleans"
        if isinstance(value, float) and value.is_integer():
            return f"write {int(value)}: an integer has no decimal point"
        if isinstance(value, str) and re.fullmatch(r"[+-]?[0-9]+", value.strip()):
            return f"write {int(value)} without quotes: a quoted number is a string"
    if kind == "bool_type" and isinstance(value, str) and value.strip().lower() in ("true", "false"):
        return f"write {value.strip().lower()} without quotes: a quoted boolean is a string"
    return _HINTS.get(kind, "")


def _data_path(loc: tuple, data: object) -> tuple:
    path: list = []
    node = data
    for i, part in enumerate(loc):
        if part == "[key]":  # pydantic's mark of an error in the key itself, which the path already ends in
            continue
        if isinstance(node, dict) and part in node:
            node = node[part]
        elif isinstance(node, list) and isinstance(part, int) and 0 <= part < len(node):
            node = node[part]
        elif i < len(loc) - 1 or not isinstance(node, dict):
            continue
        path.append(part)
    return tuple(path)


def _types_at(model: type[BaseModel], path: tuple, data: object) -> list:
    """The types ``model`` allows at data ``path``: several where a union leaves it open."""
    found: list = [model]
    node = data
    for part in path:
        found = [child for tp in _fitting(found, node) for child in _children(tp, part)]
        node = node.get(part) if isinstance(node, dict) else (
            node[part] if isinstance(node, list) and isinstance(part, int) and part < len(node) else None)
    return _fitting(found, node)


def _members(tp) -> list:
    """``tp`` without ``Annotated`` and ``None``; a union as its members."""
    origin = get_origin(tp)
    if origin is Annotated:
        return _members(get_args(tp)[0])
    if origin in (Union, types.UnionType):
        return [m for arg in get_args(tp) if arg is not type(None) for m in _members(arg)]
    return [tp]


def _children(tp, part) -> list:
    if _is_model(tp):
        field = tp.model_fields.get(part)
        return _members(field.annotation) if field else []
    origin, args = get_origin(tp), get_args(tp)
    if origin is list:
        return _members(args[0])
    if origin is tuple and isinstance(part, int) and part < len(args):
        return _members(args[part])
    if origin is dict:
        return _members(args[1])
    return []


def _fitting(candidates: list, node: object) -> list:
    """Of a tagged union's models, the one whose tag (a ``Literal`` field such as ``kind``) ``node`` has."""
    if len(candidates) < 2 or not isinstance(node, dict):
        return candidates
    fits = [tp for tp in candidates if not _is_model(tp) or all(
        node[name] in get_args(f.annotation) for name, f in tp.model_fields.items()
        if name in node and get_origin(f.annotation) is Literal)]
    return fits or candidates


def _choices(candidates: list) -> list[str]:
    out: list[str] = []
    for tp in candidates:
        if isinstance(tp, type) and issubclass(tp, enum.Enum):
            out += [m.value for m in tp]
        elif get_origin(tp) is Literal:
            out += [a for a in get_args(tp) if isinstance(a, str)]
    return out


def _is_model(tp) -> bool:
    return isinstance(tp, type) and issubclass(tp, BaseModel)


def load_model(path, display: str, model, rule: str):
    """Parse ``path`` and validate it as ``model``: (document, model instance).

    YAML and schema problems alike raise :class:`DiagnosticError` with located diagnostics.
    """
    from builder.diagnostics import DiagnosticError
    from builder.load.yamlsrc import load_yaml

    doc = load_yaml(path, display)
    try:
        return doc, model.model_validate(doc.data)
    except ValidationError as exc:
        raise DiagnosticError(diagnostics_from_validation(exc, doc, rule, model)) from None


def load_models(paths, root, model, rule: str, problems: list[Diagnostic]):
    """``(path, display, document, model instance)`` for each of ``paths`` that parses and
    validates as ``model``; the diagnostics of the others go to ``problems``, so a caller
    reports every file's problems together."""
    from builder.diagnostics import DiagnosticError
    from builder.load.paths import display_path

    for path in paths:
        display = display_path(path, root)
        try:
            doc, instance = load_model(path, display, model, rule)
        except DiagnosticError as exc:
            problems.extend(exc.diagnostics)
            continue
        yield path, display, doc, instance
