"""One trace as text: each span with its kind, ids, parent and links (the report prints it)."""

from __future__ import annotations

from opentelemetry.sdk.trace import ReadableSpan


def format_trace(spans: list[ReadableSpan]) -> str:
    """The spans in start order: ``name  KIND  trace=… span=… parent=… links=[…]``."""
    lines = []
    for s in sorted(spans, key=lambda s: s.start_time or 0):
        parent = f"{s.parent.span_id:016x}" if s.parent is not None else "-"
        links = ", ".join(f"{link.context.span_id:016x}" for link in s.links)
        kind = (s.attributes or {}).get("messaging.rocketmq.message.type")
        lines.append(f"{s.name:<20} {s.kind.name:<9} trace={s.context.trace_id:032x} "
                     f"span={s.context.span_id:016x} parent={parent} links=[{links}]"
                     + (f" type={kind}" if kind else ""))
    return "\n".join(lines)
