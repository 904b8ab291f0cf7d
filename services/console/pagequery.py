"""What a page's query string asks for, with the REST API's names understood too.

A console page takes a few query parameters of its own (``/messages?id=…``). People paste the
REST API's names as well (``message_id``, ``begin_ms``), so each page lists the aliases it
understands; anything else is not silently dropped (an empty search would look like "nothing
found") but named on the page. ``done`` and ``failed`` (the outcome of an action, after its
redirect) are every page's.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

#: Parameters every page takes: the outcome of an action, after its redirect.
OUTCOME_PARAMS = ("done", "failed")


@dataclass
class PageQuery:
    """The values a page understood (under its own names) and the parameters it did not."""

    takes: tuple[str, ...]
    aliases: Mapping[str, str] = field(default_factory=dict)
    values: dict[str, str] = field(default_factory=dict)
    unknown: list[str] = field(default_factory=list)

    def get(self, name: str, default: str = "") -> str:
        return self.values.get(name, default)

    @property
    def note(self) -> str:
        """One sentence naming what was not understood ("" when everything was)."""
        if not self.unknown:
            return ""
        names = ", ".join(repr(n) for n in self.unknown)
        plural = "s" if len(self.unknown) > 1 else ""
        also = {own: [a for a, o in self.aliases.items() if o == own] for own in self.takes}
        takes = ", ".join(f"{own} (or {', '.join(also[own])})" if also[own] else own
                          for own in self.takes) or "no query parameters"
        return (f"Ignored query parameter{plural} {names}: not understood by this page, "
                f"which takes {takes}.")


def read_query(query: Mapping[str, str], takes: tuple[str, ...],
               aliases: Mapping[str, str] | None = None) -> PageQuery:
    """``query`` read for a page taking ``takes``; ``aliases`` maps another name (the API's)
    to one of them. A page's own name wins over an alias given as well."""
    aliases = aliases or {}
    out = PageQuery(takes, aliases)
    for name in query:
        value = query[name]
        if name in takes:
            out.values[name] = value
        elif name in aliases:
            out.values.setdefault(aliases[name], value)
        elif name not in OUTCOME_PARAMS and name not in out.unknown:
            out.unknown.append(name)
    for name in takes:  # the page's own name wins, whatever the order of the query
        if name in query:
            out.values[name] = query[name]
    return out
