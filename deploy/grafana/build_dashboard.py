"""Builds the tidemq Grafana dashboard and the Prometheus rules that mirror its panels.

    python deploy/grafana/build_dashboard.py          # rewrite both files
    python deploy/grafana/build_dashboard.py --check  # exit 1 if either is out of date

Every panel query is written once, here. The dashboard JSON uses it as is (with Grafana's
``$__rate_interval``, ``$__range`` and the ``$group`` variable); the rules file records the same
query with those variables fixed (5m, 1h, every group), and ``dashboard-rules.test.yml`` checks
each recorded query against sample series with ``promtool test rules`` — so every panel's PromQL
is tested. Metric names: the metrics sidecar (services/metrics/exposition.py), the broker
(services/broker/observability.py) and the scheduler (services/scheduler/metrics.py and its
scrape-time gauges: ``tidemq_scheduler_pending_timers``, ``…_pending_level_messages``).
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

HERE = Path(__file__).resolve().parent
DASHBOARD = HERE / "dashboards" / "tidemq.json"
RULES = HERE.parent / "prometheus" / "dashboard-rules.yml"
DATASOURCE = {"type": "prometheus", "uid": "tidemq-prometheus"}
TEST_VALUES = {"$__rate_interval": "5m", "$__range": "1h", "$group": ".*"}
G = 'producer_group=~"$group"'


@dataclass(frozen=True)
class Target:
    slug: str  # recorded as tidemq_panel:<slug>
    expr: str
    legend: str = ""


@dataclass(frozen=True)
class Panel:
    title: str
    kind: str  # timeseries, bargauge, stat
    unit: str
    targets: tuple[Target, ...]
    description: str = ""
    options: dict[str, Any] = field(default_factory=dict)


def hq(q: float, metric: str, selector: str = "") -> str:
    """The q-quantile of a histogram over every series matching ``selector``."""
    matchers = f"{{{selector}}}" if selector else ""
    return (f"histogram_quantile({q}, sum by (le) "
            f"(rate({metric}_bucket{matchers}[$__rate_interval])))")


ROWS: list[tuple[str, list[Panel]]] = [
    ("Transactions", [
        Panel("Resolution funnel", "bargauge", "short", (
            Target("funnel_half",
                   f"sum(increase(tidemq_transaction_half_messages_total{{{G}}}[$__range]))",
                   "half messages"),
            Target("funnel_producer_ended",
                   f'sum(increase(tidemq_transaction_commits_total{{source="producer",{G}}}'
                   f'[$__range])) + sum(increase(tidemq_transaction_rollbacks_total'
                   f'{{source="producer",{G}}}[$__range]))', "ended by the producer"),
            Target("funnel_checked",
                   f"sum(increase(tidemq_transaction_checks_total{{{G}}}[$__range]))",
                   "checks sent"),
            Target("funnel_check_ended",
                   f'sum(increase(tidemq_transaction_commits_total{{source="check",{G}}}'
                   f'[$__range])) + sum(increase(tidemq_transaction_rollbacks_total'
                   f'{{source="check",{G}}}[$__range]))', "ended after a check"),
            Target("funnel_discarded",
                   f"sum(increase(tidemq_transaction_discards_total{{{G}}}[$__range]))",
                   "discarded"),
        ), "How the transactions of the time range ended: half messages, ended by their producer,"
           " ended by an answer to a check, discarded.",
            {"displayMode": "gradient", "orientation": "horizontal"}),
        Panel("Checks per resolved transaction", "bargauge", "short", (
            Target("check_count_distribution",
                   f"sum by (le) (increase(tidemq_transaction_resolution_checks_bucket{{{G}}}"
                   f"[$__range]))", "≤ {{le}} checks"),
        ), "Cumulative: resolved transactions that needed at most N checks.",
            {"displayMode": "basic", "orientation": "horizontal"}),
        Panel("Discards by producer group", "timeseries", "ops", (
            Target("discards_by_group",
                   f"sum by (producer_group) "
                   f"(rate(tidemq_transaction_discards_total{{{G}}}[$__rate_interval]))",
                   "{{producer_group}}"),
        ), "Half messages discarded per second (too many checks, or too old)."),
        Panel("Half-to-commit latency", "timeseries", "s", (
            Target("commit_latency_p50", hq(0.5, "tidemq_transaction_resolution_seconds",
                                            f'outcome="commit",{G}'), "p50"),
            Target("commit_latency_p90", hq(0.9, "tidemq_transaction_resolution_seconds",
                                            f'outcome="commit",{G}'), "p90"),
            Target("commit_latency_p99", hq(0.99, "tidemq_transaction_resolution_seconds",
                                            f'outcome="commit",{G}'), "p99"),
            Target("commit_latency_p99_since_start",
                   f'max(tidemq_transaction_resolution_quantiles_seconds'
                   f'{{outcome="commit",quantile="0.99",{G}}})', "p99 since the job began"),
        ), "Time from half message to commit (from the job's histogram; the last line is the"
           " job's own percentile over everything it has read)."),
        Panel("Resolutions per second", "timeseries", "ops", (
            Target("resolutions_by_outcome",
                   f"sum by (outcome) (rate(tidemq_transaction_resolution_seconds_count{{{G}}}"
                   f"[$__rate_interval]))", "{{outcome}}"),
        )),
        Panel("Metrics job", "timeseries", "short", (
            Target("job_up", "min(tidemq_metrics_job_up)", "job up"),
            Target("malformed_events",
                   "sum by (reason) "
                   "(rate(tidemq_metrics_malformed_events_total[$__rate_interval]))",
                   "malformed: {{reason}}"),
        ), "The PySpark job: up, malformed events per second."),
        Panel("Metrics job liveness", "timeseries", "s", (
            Target("job_liveness_age", "max(tidemq_metrics_last_batch_completed_age_seconds)",
                   "since the last completed batch or poll"),
            Target("newest_event_age", "max(tidemq_metrics_newest_event_age_seconds)",
                   "since the newest event was read"),
        ), "Liveness: seconds since the job last completed a micro-batch or an empty poll of the"
           " broker; it stays within a few trigger intervals (5 s) while the job runs, and only"
           " grows when the job stopped (alert TidemqMetricsJobStalled). The age of the newest"
           " event grows whenever no transactions happen: quiet, not broken."),
    ]),
    ("Brokers", [
        Panel("Messages sent per second", "timeseries", "ops", (
            Target("send_rate",
                   "sum by (topic) (rate(tidemq_broker_messages_put_total[$__rate_interval]))",
                   "{{topic}}"),
        )),
        Panel("Messages consumed per second", "timeseries", "ops", (
            Target("consume_rate",
                   "sum by (topic) (rate(tidemq_broker_pulled_messages_total"
                   "[$__rate_interval]))", "{{topic}}"),
        )),
        Panel("Store write latency", "timeseries", "s", (
            Target("put_latency_p99", hq(0.99, "tidemq_broker_put_latency_seconds"),
                   "p99"),
        )),
        Panel("Consumer lag", "timeseries", "short", (
            Target("consumer_lag", "sum by (group, topic) (tidemq_broker_consumer_lag)",
                   "{{group}} / {{topic}}"),
        )),
    ]),
    ("Scheduler", [
        Panel("Pending timers", "timeseries", "short", (
            Target("pending_timers", "sum(tidemq_scheduler_pending_timers)",
                   "timers (delay_ms / deliver_at_ms)"),
            Target("pending_level_messages", "sum(tidemq_scheduler_pending_level_messages)",
                   "delay-level messages"),
        ), "Delayed messages waiting in the scheduler."),
        Panel("Delivery lateness", "timeseries", "s", (
            Target("lateness_p50", hq(0.5, "tidemq_scheduler_lateness_seconds"), "p50"),
            Target("lateness_p99", hq(0.99, "tidemq_scheduler_lateness_seconds"), "p99"),
        ), "How late due messages were delivered (scheduler clock against the due time)."),
    ]),
]


def fixed(expr: str) -> str:
    """A panel query with the dashboard's variables fixed, as the rules file records it."""
    for var, value in TEST_VALUES.items():
        expr = expr.replace(var, value)
    return expr


def _panel_json(panel: Panel, pid: int, x: int, y: int) -> dict[str, Any]:
    out: dict[str, Any] = {
        "id": pid, "type": panel.kind, "title": panel.title, "datasource": DATASOURCE,
        "gridPos": {"h": 8, "w": 12, "x": x, "y": y},
        "fieldConfig": {"defaults": {"unit": panel.unit}, "overrides": []},
        "options": {"legend": {"displayMode": "list", "placement": "bottom", "showLegend": True},
                    **panel.options},
        "targets": [{"refId": chr(ord("A") + i), "datasource": DATASOURCE, "expr": t.expr,
                     "legendFormat": t.legend, "range": True}
                    for i, t in enumerate(panel.targets)],
    }
    if panel.description:
        out["description"] = panel.description
    if panel.kind == "bargauge":
        out["options"]["reduceOptions"] = {"calcs": ["lastNotNull"], "fields": "",
                                           "values": False}
    return out


def dashboard() -> dict[str, Any]:
    panels: list[dict[str, Any]] = []
    pid, y = 1, 0
    for title, row in ROWS:
        panels.append({"id": pid, "type": "row", "title": title, "collapsed": False,
                       "gridPos": {"h": 1, "w": 24, "x": 0, "y": y}, "panels": []})
        pid, y = pid + 1, y + 1
        for i, panel in enumerate(row):
            panels.append(_panel_json(panel, pid, 12 * (i % 2), y + 8 * (i // 2)))
            pid += 1
        y += 8 * ((len(row) + 1) // 2)
    group_var = {
        "name": "group", "label": "producer group", "type": "query", "datasource": DATASOURCE,
        "query": {"query": "label_values(tidemq_transaction_half_messages_total, "
                           "producer_group)", "refId": "group"},
        "definition": "label_values(tidemq_transaction_half_messages_total, producer_group)",
        "includeAll": True, "multi": True, "allValue": ".*", "refresh": 2, "sort": 1,
        "current": {"selected": True, "text": ["All"], "value": ["$__all"]},
    }
    return {
        "uid": "tidemq-overview", "title": "tidemq", "tags": ["tidemq"], "editable": True,
        "schemaVersion": 39, "version": 1, "refresh": "30s", "timezone": "browser",
        "time": {"from": "now-1h", "to": "now"}, "graphTooltip": 1,
        "templating": {"list": [group_var]}, "annotations": {"list": []}, "links": [],
        "panels": panels,
    }


def targets() -> list[Target]:
    return [t for _, row in ROWS for panel in row for t in panel.targets]


def rules() -> dict[str, Any]:
    return {"groups": [{
        "name": "tidemq-dashboard-panels",
        "interval": "1m",
        "rules": [{"record": f"tidemq_panel:{t.slug}", "expr": fixed(t.expr)}
                  for t in targets()],
    }]}


def render() -> dict[Path, str]:
    header = ("# Generated by deploy/grafana/build_dashboard.py: every Grafana panel query,\n"
              "# recorded with $__rate_interval=5m, $__range=1h and every producer group.\n"
              "# Tested by dashboard-rules.test.yml (promtool test rules).\n")
    return {
        DASHBOARD: json.dumps(dashboard(), indent=2, ensure_ascii=False) + "\n",
        RULES: header + yaml.safe_dump(rules(), sort_keys=False, width=200,
                                       allow_unicode=True),
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--check", action="store_true", help="fail if a file is out of date")
    args = ap.parse_args(argv)
    stale = []
    for path, text in render().items():
        current = path.read_text(encoding="utf-8") if path.exists() else None
        if current == text:
            continue
        if args.check:
            stale.append(str(path))
        else:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text, encoding="utf-8")
            print(f"wrote {path}")
    if stale:
        print("out of date (run python deploy/grafana/build_dashboard.py): " + ", ".join(stale),
              file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
