"""Rollups → Prometheus exposition: names, values, buckets, and `promtool check metrics`."""

from __future__ import annotations

import pytest

from tests.support.metrics import encode, parse_exposition, promtool, sample, scenario
from tidemq_server.metrics.events import parse_event
from tidemq_server.metrics.exposition import BatchInfo, escape, render
from tidemq_server.metrics.rollup import exact_quantile, python_rollup


def scripted() -> list[bytes]:
    return [encode(b) for b in scenario()]


def rendered() -> str:
    return render(python_rollup(parse_event(b) for b in scripted()), BatchInfo(7, 1234.5))


@pytest.mark.integration  # runs promtool (make test-unit needs nothing but the venv)
def test_exposition_passes_promtool() -> None:
    promtool("check", "metrics", stdin=rendered())


def test_counts_per_group_topic_and_source() -> None:
    s = parse_exposition(rendered())
    shop = {"producer_group": "shop", "topic": "Orders"}
    assert sample(s, "tidemq_transaction_half_messages_total", **shop) == 11
    assert sample(s, "tidemq_transaction_commits_total", **shop, source="producer") == 5
    assert sample(s, "tidemq_transaction_commits_total", **shop, source="check") == 1
    assert sample(s, "tidemq_transaction_rollbacks_total", **shop, source="check") == 1
    assert sample(s, "tidemq_transaction_unknowns_total", **shop, source="producer") == 2
    assert sample(s, "tidemq_transaction_unknowns_total", **shop, source="check") == 16
    assert sample(s, "tidemq_transaction_checks_total", **shop) == 18
    assert sample(s, "tidemq_transaction_check_outcomes_total", **shop, outcome="unknown") == 16
    assert sample(s, "tidemq_transaction_discards_total", **shop) == 1
    weird = {"producer_group": 'we"ird\\group', "topic": "Pay"}
    assert sample(s, "tidemq_transaction_commits_total", **weird, source="producer") == 1
    assert sample(s, "tidemq_transaction_discards_total", **weird) == 0  # zero-filled
    assert sample(s, "tidemq_metrics_events_read_total") == len(scripted())
    assert sample(s, "tidemq_metrics_malformed_events_total", reason="bad_type") == 2
    assert sample(s, "tidemq_metrics_batch_id") == 7


def test_latency_histogram_summary_and_check_histogram() -> None:
    s = parse_exposition(rendered())
    commit = {"producer_group": "shop", "topic": "Orders", "outcome": "commit"}
    name = "tidemq_transaction_resolution_seconds"
    # commits after 0.05, 0.2, 0.7, 3, 40 (producer) and 7 s (check)
    for le, count in (("0.1", 1), ("0.25", 2), ("1.0", 3), ("2.5", 3), ("5.0", 4),
                      ("10.0", 5), ("30.0", 5), ("60.0", 6), ("+Inf", 6)):
        assert sample(s, name + "_bucket", **commit, le=le) == count, le
    assert sample(s, name + "_count", **commit) == 6
    assert abs(sample(s, name + "_sum", **commit) - 50.95) < 1e-9
    summary = "tidemq_transaction_resolution_quantiles_seconds"
    ordered = sorted([0.05, 0.2, 0.7, 3.0, 40.0, 7.0])
    assert sample(s, summary, **commit, quantile="0.5") == exact_quantile(ordered, 0.5) == 0.7
    assert sample(s, summary, **commit, quantile="0.99") == 40.0
    discard = {**commit, "outcome": "discard"}
    assert sample(s, name + "_bucket", **discard, le="300.0") == 0
    assert sample(s, name + "_bucket", **discard, le="600.0") == 1
    checks = "tidemq_transaction_resolution_checks"
    assert sample(s, checks + "_bucket", **discard, le="10.0") == 0
    assert sample(s, checks + "_bucket", **discard, le="15.0") == 1
    assert sample(s, checks + "_bucket", **commit, le="0.0") == 5
    assert sample(s, checks + "_bucket", **commit, le="1.0") == 6
    rollback = {**commit, "outcome": "rollback"}
    assert sample(s, checks + "_sum", **rollback) == 2


def test_label_escaping() -> None:
    assert escape('a"b\\c\nd') == 'a\\"b\\\\c\\nd'

