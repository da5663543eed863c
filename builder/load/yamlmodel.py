"""The pydantic base of every YAML file's model, and the strict scalars it uses.

``tilekiln schema`` publishes these models as JSON Schema, where an integer is
an integer and a boolean a boolean. pydantic's default (lax) mode would still
take ``"4"``, ``4.0`` or ``true`` for an int and ``"true"`` or ``1`` for a
bool, so a file the editor flags would pass the validator. Scalars are made
strict one type at a time instead of with ``ConfigDict(strict=True)``, which
would also refuse what YAML rightly gives: enum members as strings and
tuples as lists. Mapping keys stay lax (pydantic's ``PositiveInt``): the YAML
loader turns every key into a string (builder/load/yamlsrc.py).

Imports nothing from the rest of ``builder``.
"""

from __future__ import annotations

from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field, Strict

StrictPositiveInt = Annotated[int, Strict(), Field(gt=0)]


class YamlModel(BaseModel):
    """Unknown keys are errors; a validated file is an immutable value."""

    model_config = ConfigDict(extra="forbid", frozen=True)
