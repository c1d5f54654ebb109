"""Finished spans as `SpanRecord`s (proto, what the Traces RPC returns) and as plain dicts (what
/admin/traces serves as JSON and `pdorch trace` reads)."""

from __future__ import annotations

import json
from collections.abc import Iterable

from google.protobuf.json_format import MessageToDict
from opentelemetry.sdk.trace import ReadableSpan

from proto.pdorch.v1 import worker_pb2 as pb


def span_record(span: ReadableSpan) -> pb.SpanRecord:
    sc = span.context
    resource = span.resource.attributes if span.resource is not None else {}
    return pb.SpanRecord(
        trace_id=f"{sc.trace_id:032x}", span_id=f"{sc.span_id:016x}",
        parent_span_id=f"{span.parent.span_id:016x}" if span.parent is not None else "",
        name=span.name, service=str(resource.get("service.name", "")),
        instance=str(resource.get("service.instance.id", "")),
        start_unix_ns=span.start_time or 0, end_unix_ns=span.end_time or 0,
        attributes_json=json.dumps({k: list(v) if isinstance(v, tuple) else v
                                    for k, v in (span.attributes or {}).items()}),
        status_code=int(span.status.status_code.value), status_message=span.status.description or "",
        links=[pb.SpanLink(trace_id=f"{link.context.trace_id:032x}", span_id=f"{link.context.span_id:016x}")
               for link in span.links])


def record_dict(record: pb.SpanRecord) -> dict:
    """One record as JSON-ready data: the proto's fields, attributes as an object, times as ints."""
    out = MessageToDict(record, preserving_proto_field_name=True, always_print_fields_with_no_presence=True)
    out["start_unix_ns"], out["end_unix_ns"] = record.start_unix_ns, record.end_unix_ns
    out["attributes"] = json.loads(out.pop("attributes_json") or "{}")
    return out


def merge_records(groups: Iterable[Iterable[pb.SpanRecord]]) -> list[pb.SpanRecord]:
    """Records from several processes as one trace: each span once, ordered by start."""
    seen: dict[tuple[str, str], pb.SpanRecord] = {}
    for records in groups:
        for record in records:
            seen.setdefault((record.trace_id, record.span_id), record)
    return sorted(seen.values(), key=lambda r: (r.start_unix_ns, r.end_unix_ns))
