"""Turn pydantic ``ValidationError`` entries into located diagnostics.

pydantic reports a ``loc`` path into the data; the YAML document maps that
path back to a line and column. Union and tagged-model internals that pydantic
inserts into ``loc`` (type names, discriminator tags such as ``tcgen05``,
``function-after`` steps) are dropped by walking the path through the data:
an element is kept when the data has it there, or when it is the last one
(the name of a missing key).
"""

from __future__ import annotations


from pydantic import ValidationError

from builder.diagnostics import Diagnostic
from builder.yamlsrc import YamlDocument

_HINTS = {
    "extra_forbidden": "remove the key or fix its spelling; unknown keys are rejected",
    "missing": "add the required key",
    "enum": "use one of the listed values",
    "literal_error": "use one of the listed values",
    "int_type": "write a whole number",
    "int_parsing": "write a whole number",
    "list_type": "write a YAML list, e.g. [1, 2]",
    "tuple_type": "write a YAML list, e.g. [1, 2]",
}


def diagnostics_from_validation(exc: ValidationError, doc: YamlDocument, rule_prefix: str) -> list[Diagnostic]:
    out = []
    for err in exc.errors(include_url=False):
        path = _data_path(err["loc"], doc.data)
        kind = err["type"]
        message, hint = err["msg"], _HINTS.get(kind, "")
        if kind == "value_error":
            # A model's own check raises ValueError("what is wrong; how to fix it").
            message, _, hint = str(err["ctx"]["error"]).partition("; ")
            if not isinstance(err.get("input"), (dict, list)):
                message = f"{message} (got {err.get('input')!r})"
        elif kind == "extra_forbidden":
            message = f"unknown key {path[-1]!r}"
        elif kind == "missing":
            message = f"missing required key {path[-1]!r}"
        elif "input" in err and kind not in ("missing",):
            message = f"{message} (got {err['input']!r})"
        out.append(Diagnostic(f"{rule_prefix}", message, doc.locate(path), hint))
    return out


def _data_path(loc: tuple, data: object) -> tuple:
    path: list = []
    node = data
    for i, part in enumerate(loc):
        if isinstance(node, dict) and part in node:
            node = node[part]
        elif isinstance(node, list) and isinstance(part, int) and 0 <= part < len(node):
            node = node[part]
        elif i < len(loc) - 1 or not isinstance(node, dict):
            continue
        path.append(part)
    return tuple(path)


def load_model(path, display: str, model, rule: str):
    """Parse ``path`` and validate it as ``model``: (document, model instance).

    YAML and schema problems alike raise :class:`DiagnosticError` with located diagnostics.
    """
    from builder.diagnostics import DiagnosticError
    from builder.yamlsrc import load_yaml

    doc = load_yaml(path, display)
    try:
        return doc, model.model_validate(doc.data)
    except ValidationError as exc:
        raise DiagnosticError(diagnostics_from_validation(exc, doc, rule)) from None


def load_models(paths, root, model, rule: str, problems: list[Diagnostic]):
    """``(path, display, document, model instance)`` for each of ``paths`` that parses and
    validates as ``model``; the diagnostics of the others go to ``problems``, so a caller
    reports every file's problems together."""
    from builder.diagnostics import DiagnosticError
    from builder.paths import display_path

    for path in paths:
        display = display_path(path, root)
        try:
            doc, instance = load_model(path, display, model, rule)
        except DiagnosticError as exc:
            problems.extend(exc.diagnostics)
            continue
        yield path, display, doc, instance
