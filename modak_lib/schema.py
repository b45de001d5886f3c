"""JSON Schemas generated from the pydantic models (so docs and validation agree)."""
from __future__ import annotations

from typing import Any, Optional

from pydantic.json_schema import models_json_schema


def schemas(only: Optional[str] = None) -> dict[str, Any]:
    from .models import Application, JobOptions, Optimisation, Plan, Target
    from .readers.dsl import DslDocument

    parts = {
        "dsl": [(DslDocument, "validation")],
        "infra": [(Target, "validation")],
        "tosca": [(Application, "validation"), (JobOptions, "validation"),
                  (Optimisation, "validation")],
        "plan": [(Plan, "serialization")],
    }
    if only:
        models = parts[only]
        if len(models) == 1:
            schema = models[0][0].model_json_schema(by_alias=True, mode=models[0][1])
            schema["$schema"] = "https://json-schema.org/draft/2020-12/schema"
            return schema
        parts = {only: models}
    all_models = [m for group in parts.values() for m in group]
    _, doc = models_json_schema(all_models, by_alias=True, title="MODAK inputs",
                                description="MODAK DSL documents, infrastructure files, the "
                                "properties of the TOSCA job node, and plan.json")
    doc["$schema"] = "https://json-schema.org/draft/2020-12/schema"
    return doc
