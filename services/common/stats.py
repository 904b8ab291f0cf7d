"""Statistics a service keeps in plain dicts, exported at scrape time as real metric families.

A part of a service (the store, the transaction table, the scheduler's timer store) counts in a
``dict[str, float]`` it updates for free on its hot path; ``StatsCollector`` reads that dict
when Prometheus scrapes and exports each key through its ``Stat``: a gauge (a level that goes up
and down) or a counter (a running total, exported with ``_total``), with real HELP text and the
base units of the Prometheus conventions (seconds, bytes; ``scale`` converts milliseconds).
A key without a ``Stat`` is not exported (logged once): nothing reaches ``/metrics`` with a
placeholder description, and a new statistic is described where it is declared.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Literal

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class Stat:
    """How one statistic is exported."""

    help: str  # the family's HELP text: what it counts or measures, with its unit
    kind: Literal["gauge", "counter"] = "gauge"
    name: str = ""  # the family's name after the prefix ("" = the key; counters add _total)
    scale: float = 1.0  # multiplies the value, e.g. 0.001 for a key kept in milliseconds


def counter(help_text: str, name: str = "") -> Stat:
    return Stat(help_text, "counter", name)


class StatsCollector(Collector):
    """Exports the dict ``source()`` returns, key by key, as ``specs`` describe them."""

    def __init__(self, prefix: str, source: Callable[[], Mapping[str, float]],
                 specs: Mapping[str, Stat], what: str) -> None:
        self.prefix = prefix
        self.source = source
        self.specs = specs
        self.what = what
        self._undescribed: set[str] = set()

    def collect(self) -> Iterator[Metric]:
        try:
            stats = self.source()
        except Exception:  # a scrape must not fail because one source did
            log.exception("%s statistics unavailable", self.what)
            return
        for key, value in sorted(stats.items()):
            spec = self.specs.get(key)
            if spec is None:
                if key not in self._undescribed:
                    self._undescribed.add(key)
                    log.warning("%s statistic %r has no description: not exported", self.what,
                                key)
                continue
            name = self.prefix + (spec.name or key)
            number = float(value) * spec.scale
            if spec.kind == "counter":
                yield CounterMetricFamily(name, spec.help, value=number)
            else:
                yield GaugeMetricFamily(name, spec.help, value=number)
