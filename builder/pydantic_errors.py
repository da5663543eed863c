"""Turn pydantic ``ValidationError`` entries into located diagnostics.

pydantic reports a ``loc`` path into the data; the YAML document maps that
path back to a line and column. Union and tagged-model internals that pydantic
inserts into ``loc`` (class names, ``function-after`` steps) are dropped so the
path matches the YAML keys.
"""

from __future__ import annotations

import re

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


def diagnostics_from_validation(exc: ValidationError, doc: YamlDocument, rule_prefix: str,
                                base: tuple = ()) -> list[Diagnostic]:
    out = []
    for err in exc.errors(include_url=False):
        path = base + tuple(p for p in err["loc"] if _is_data_key(p))
        kind = err["type"]
        message = err["msg"]
        if kind == "extra_forbidden":
            message = f"unknown key {path[-1]!r}"
        elif kind == "missing":
            message = f"missing required key {path[-1]!r}"
        elif "input" in err and kind not in ("missing",):
            message = f"{message} (got {err['input']!r})"
        out.append(Diagnostic(f"{rule_prefix}", message, doc.locate(path), _HINTS.get(kind, "")))
    return out


_TYPE_TAGS = {"int", "str", "float", "bool", "list", "dict", "tuple", "none", "is-instance"}


def _is_data_key(part: object) -> bool:
    """Keep YAML keys and indices; drop the union-member tags pydantic inserts."""
    if isinstance(part, int):
        return True
    return re.fullmatch(r"[a-z_][a-z0-9_]*", str(part)) is not None and part not in _TYPE_TAGS
