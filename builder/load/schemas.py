"""JSON Schemas of the YAML files tilekiln reads, from the pydantic models that validate them.

Editors running yaml-language-server complete and check a file against the
schema named on its first line, ``# yaml-language-server: $schema=<path>``.
"""

from __future__ import annotations

from builder.load.catalog import CatalogFile, CatalogSettings
from builder.load.facts import FactsFile
from builder.load.templates import TemplateManifest

_MODELS = {
    "catalog": (CatalogFile, "tilekiln kernel catalog (catalog/gemm/*.yaml)"),
    "settings": (CatalogSettings, "tilekiln catalog settings (catalog/catalog.yaml)"),
    "facts": (FactsFile, "tilekiln hardware facts (catalog/hardware/*.yaml)"),
    "template": (TemplateManifest, "tilekiln template manifest (templates/*.yaml)"),
}


def schema_of(kind: str) -> dict:
    model, title = _MODELS[kind]
    return {"$schema": "https://json-schema.org/draft/2020-12/schema"} | model.model_json_schema() | {"title": title}
