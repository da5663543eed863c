"""JSON objects from files the runtime has not verified yet (a manifest, a tuning or signature file).

:func:`load_object` is ``json.loads`` with bounds, so that a hostile file ends in a
``ValueError`` the caller turns into ``BundleIntegrityError``, never in a
``RecursionError``, an ``OverflowError`` from a number or a value no writer produces:

- nesting at most :data:`MAX_DEPTH` levels (the deepest file tilekiln writes nests 7:
  ``tuning.measurements.<bucket>.samples.<kernel>[run][sample]``); the C scanner raises
  ``RecursionError`` near the interpreter's recursion limit, which is caught too;
- numbers finite: ``NaN``, ``Infinity`` and a literal such as ``1e999`` (which ``float``
  reads as infinity, and ``int(inf)`` overflows) are refused;
- integers within int64; Python caps integer literals at 4300 digits itself.

Standard library only.
"""

from __future__ import annotations

import json
import math

MAX_DEPTH = 32
INT64 = 2**63


def load_object(raw: bytes) -> dict:
    """The JSON object ``raw`` holds; ``ValueError`` naming the problem otherwise."""
    try:
        data = json.loads(raw, parse_constant=_refuse_constant, parse_float=_finite_float)
    except RecursionError:
        raise ValueError(f"nests deeper than {MAX_DEPTH} levels") from None
    if not isinstance(data, dict):
        raise ValueError("not an object")
    _check_bounds(data)
    return data


def _refuse_constant(name: str):
    raise ValueError(f"{name} is not a JSON number")


def _finite_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise ValueError(f"number {text[:40]} is out of range")
    return value


def _check_bounds(data: dict) -> None:
    """Depth and integer range, walked without recursion."""
    stack = [(data, 1)]
    while stack:
        value, depth = stack.pop()
        if isinstance(value, (dict, list)):
            if depth > MAX_DEPTH:
                raise ValueError(f"nests deeper than {MAX_DEPTH} levels")
            stack.extend((v, depth + 1) for v in (value.values() if isinstance(value, dict) else value))
        elif isinstance(value, int) and not isinstance(value, bool) and not -INT64 <= value < INT64:
            raise ValueError(f"integer {str(value)[:40]}... is out of range")
