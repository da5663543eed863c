"""The pydantic base of every YAML file's model, and the strict scalars it uses.

``tilekiln schema`` publishes these models as JSON Schema, where an integer is
an integer and a boolean a boolean. pydantic's default (lax) mode would still
take ``"4"``, ``4.0`` or ``true`` for an int and ``"true"`` or ``1`` for a
bool, so a file the editor flags would pass the validator. Scalars are made
strict one type at a time instead of with ``ConfigDict(strict=True)``, which
would also refuse what YAML rightly gives: enum members as strings and
tuples as lists. Mapping keys stay lax (pydantic's ``PositiveInt``): the YAML
loader turns every key into a string (builder/load/yamlsrc.py).

Every string that reaches a file name, a bundle name or a compile command
has a grammar here (a pipeline, a compile target, a template file name), and
every count a bound, so no catalog value can name a path outside the
project, spell a command option or make a kernel id too long for a file name.

Imports nothing from the rest of ``builder``.
"""

from __future__ import annotations

from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field, Strict

from tilekiln.spec import PIPELINE_PATTERN

# No count in a catalog or template manifest comes near 2^16 (the largest are shared-memory
# bytes, 1,024 today); the bound keeps kernel ids short and loops over counts brief.
MAX_COUNT = 1 << 16
StrictPositiveInt = Annotated[int, Strict(), Field(gt=0, le=MAX_COUNT)]
StrictCount = Annotated[int, Strict(), Field(ge=0, le=MAX_COUNT)]

# The grammar of tilekiln/spec.py's pipeline token, e.g. sm90.
PipelineName = Annotated[str, Field(pattern=f"^{PIPELINE_PATTERN}$", description="a pipeline, e.g. sm90")]
# A compile target (--gpu-arch), e.g. sm_90a; its bundle is named sm90a (builder/package/bundle.py).
TargetName = Annotated[str, Field(pattern=r"^sm_[1-9][0-9]{1,3}[af]?$", description="a compile target, e.g. sm_90a")]
# A template beside its manifest in templates/: a plain file name, never a path.
TemplateFileName = Annotated[str, Field(pattern=r"^[a-z][a-z0-9_]{0,63}\.py\.j2$",
                                        description="the Jinja2 template beside this manifest, e.g. sm90_gemm.py.j2")]


class YamlModel(BaseModel):
    """Unknown keys are errors; a validated file is an immutable value."""

    model_config = ConfigDict(extra="forbid", frozen=True)
