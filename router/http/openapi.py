"""OpenAPI documentation of request bodies that handlers parse themselves.

Handlers read the raw body and validate it with `model_validate_json` (strict, with our own
400 errors), so FastAPI cannot infer the schemas; `document_bodies` puts them back in.
"""

from __future__ import annotations

from pydantic import BaseModel


def document_bodies(model: type[BaseModel]) -> dict:
    schema = model.model_json_schema(ref_template="#/components/schemas/{model}")
    defs = schema.pop("$defs", {})
    # NOTE: nested models are inlined under their own names so the $refs resolve in /openapi.json.
    schema = _inline(schema, defs)
    return {"requestBody": {"required": True, "content": {"application/json": {"schema": schema}}}}


def _inline(node, defs):
    if isinstance(node, dict):
        ref = node.get("$ref")
        if ref and ref.startswith("#/components/schemas/"):
            name = ref.rsplit("/", 1)[1]
            if name in defs:
                return _inline(defs[name], defs)
        return {k: _inline(v, defs) for k, v in node.items()}
    if isinstance(node, list):
        return [_inline(v, defs) for v in node]
    return node
