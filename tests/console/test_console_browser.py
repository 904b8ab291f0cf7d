"""The web console end to end: real nameserver, broker, scheduler and console processes, driven
in Debian's headless Chromium through Playwright. Each view shows what the test created over
REST (rates, lag over time, the timers histogram, a message's full trace, discarded halves);
cancelling a timer, resending one or all dead letters and resolving a discarded transaction
through the pages take effect (checked over REST); the browser console stays free of errors.
Writes a screenshot of each view to $TIDEMQ_CONSOLE_SHOTS when set (docs/console/ holds the
ones the README shows: `TIDEMQ_CONSOLE_SHOTS=docs/console` refreshes them), else to a temporary
folder, so a test run leaves the checkout clean."""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import httpx
import pytest
from typer.testing import CliRunner

from tests.support.broker import TOKEN, BrokerHandle, run_broker, unique
from tests.support.clock import now_ms
from tests.support.procs import RedisServer, ServiceProcess, free_port
from tests.support.wait import wait_until
from tidemq_server.cli import app as cli_app

pytestmark = pytest.mark.integration

playwright_api = pytest.importorskip("playwright.sync_api")
CHROMIUM = "/usr/bin/chromium"
SHOTS = Path(os.environ.get("TIDEMQ_CONSOLE_SHOTS")
             or Path(tempfile.gettempdir()) / "tidemq-console-shots")
AUTH = {"X-Tidemq-Token": TOKEN}
DAY_MS = 86_400_000
TRACEPARENT = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"  # W3C example
BULK_DEAD = 300  # dead letters of one group: more than one page (256) of a DLQ queue
ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking",
        "--disable-component-update", "--disable-sync", "--no-first-run"]


class System:
    def __init__(self, broker: BrokerHandle, console: ServiceProcess, nameserver: str,
                 cluster: str) -> None:
        self.broker, self.console = broker, console
        self.nameserver, self.cluster = nameserver, cluster
        self.topic = unique("Orders")
        self.group = unique("billing")
        self.dlq_group = unique("dlqg")
        self.producer_group = unique("orders-tx")
        self.audit = unique("audit")
        self.bulk_topic = unique("Bulk")
        self.bulk_group = unique("bulkg")
        self.ids: dict[str, str] = {}
        self.day0 = 0  # midnight UTC of the first day with seeded far timers
        self.timer_due = 0  # the timer the timers test cancels: its due time (epoch ms)


@pytest.fixture(scope="module")
def system(tmp_path_factory: pytest.TempPathFactory,
           redis_server: RedisServer) -> Iterator[System]:
    if not shutil.which(CHROMIUM):
        pytest.fail(f"{CHROMIUM} is missing: run scripts/install-system-deps.sh")
    workdir = tmp_path_factory.mktemp("console")
    cluster = unique("cluster")
    with ExitStack() as stack:
        ns_port = free_port()
        ns = ServiceProcess("nameserver", ns_port, {
            "TIDEMQ_NAMESRV_PORT": str(ns_port), "TIDEMQ_NAMESRV_TOKEN": TOKEN,
            "TIDEMQ_NAMESRV_LOG_LEVEL": "warning"}, workdir)
        stack.callback(ns.start().stop)
        sched_port = free_port()
        broker = stack.enter_context(run_broker(
            workdir, redis_server.url, cluster=cluster, nameservers=ns.url,
            scheduler_url=f"http://127.0.0.1:{sched_port}", max_reconsume_times=0,
            long_poll_max_ms=100))
        sched = ServiceProcess("scheduler", sched_port, {
            "TIDEMQ_SCHEDULER_PORT": str(sched_port), "TIDEMQ_SCHEDULER_BROKER_URL": broker.url,
            "TIDEMQ_SCHEDULER_TOKEN": TOKEN,
            "TIDEMQ_SCHEDULER_REDIS_URL": redis_server.url, "TIDEMQ_SCHEDULER_CLUSTER": cluster,
            "TIDEMQ_SCHEDULER_DATA_DIR": str(workdir / "scheduler"),
            "TIDEMQ_SCHEDULER_LOG_LEVEL": "warning"}, workdir)
        stack.callback(sched.start().stop)
        console_port = free_port()
        console = ServiceProcess("console", console_port, {
            "TIDEMQ_CONSOLE_PORT": str(console_port), "TIDEMQ_CONSOLE_NAMESERVERS": ns.url,
            "TIDEMQ_CONSOLE_TOKEN": TOKEN, "TIDEMQ_CONSOLE_SAMPLE_INTERVAL_S": "0.5",
            "TIDEMQ_CONSOLE_SCHEDULERS": sched.url}, workdir)
        stack.callback(console.start().stop)
        s = System(broker, console, ns.url, cluster)
        _seed(s)
        yield s


def _seed(s: System) -> None:
    b = s.broker
    b.create_topic(s.topic, queues=2)
    s.ids["json"] = b.send(s.topic, {"message_id": unique("m"), "body": json.dumps(
        {"order": 42, "paid": True}), "keys": ["order-42"], "tag": "Paid",
        "properties": {"source": "web", "traceparent": TRACEPARENT},
        "queue_id": 0})[0]["message_id"]
    b.send(s.topic, *({"body": f"filler {i}", "queue_id": 1} for i in range(5)))
    s.ids["timer"] = unique("pay-check")
    s.timer_due = now_ms() + 3_600_000
    b.send(s.topic, {"message_id": s.ids["timer"], "body": "check payment",
                     "deliver_at_ms": s.timer_due})
    resp = b.http.put(f"/v1/groups/{s.group}/offsets", json={"offsets": [
        {"topic": s.topic, "queue_id": 1, "offset": 2}]})
    assert resp.status_code == 200, resp.text
    resp = b.http.post("/v1/transactions", json={
        "producer_group": s.producer_group, "topic": s.topic,
        "message": {"body": "order 44 created"}, "check_immunity_s": 3600})
    assert resp.status_code == 200, resp.text
    s.ids["half"] = resp.json()["message_id"]
    s.ids["dead"] = unique("dead")
    b.send(s.topic, {"message_id": s.ids["dead"], "body": "poison", "queue_id": 0})
    resp = b.http.post(f"/v1/groups/{s.dlq_group}/retry", json={"message_id": s.ids["dead"]})
    assert resp.json()["destination"] == f"%DLQ%{s.dlq_group}", resp.text
    # the json message (queue 0, offset 0) consumed by the audit group
    resp = b.http.put(f"/v1/groups/{s.audit}/offsets", json={"offsets": [
        {"topic": s.topic, "queue_id": 0, "offset": 1}]})
    assert resp.status_code == 200, resp.text
    # a transaction checked twice, then committed; two discarded ones (to commit and to drop)
    s.ids["checked"] = _half(b, s, check=2)
    resp = b.http.post(f"/v1/transactions/{s.ids['tx:' + s.ids['checked']]}/end", json={
        "producer_group": s.producer_group, "action": "commit"})
    assert resp.status_code == 200, resp.text
    s.ids["to-commit"] = _half(b, s, check=1, discard=True)
    s.ids["to-drop"] = _half(b, s, discard=True)
    s.ids["conflict"] = _half(b, s, discard=True)
    # far timers: two due on one day, one on the next
    s.day0 = now_ms() // DAY_MS * DAY_MS + 2 * DAY_MS
    b.send(s.topic, *({"body": f"far {i}", "deliver_at_ms": s.day0 + (i + 1) * 3_600_000}
                      for i in range(2)), {"body": "far 2", "deliver_at_ms": s.day0 + DAY_MS})
    # a DLQ longer than one page
    b.create_topic(s.bulk_topic, queues=1)
    sent = b.send(s.bulk_topic, *({"body": f"bulk {i}"} for i in range(BULK_DEAD)))

    def dead_letter(message_id: str) -> int:
        return b.http.post(f"/v1/groups/{s.bulk_group}/retry",
                           json={"message_id": message_id}).status_code

    with ThreadPoolExecutor(4) as pool:
        assert set(pool.map(dead_letter, [r["message_id"] for r in sent])) == {200}


def _half(b: BrokerHandle, s: System, check: int = 0, discard: bool = False) -> str:
    """A half message of the test's producer group, checked ``check`` times and maybe
    discarded by acting as the checker; its message id."""
    resp = b.http.post("/v1/transactions", json={
        "producer_group": s.producer_group, "topic": s.topic,
        "message": {"body": f"order {unique('o')}"}, "check_immunity_s": 3600})
    assert resp.status_code == 200, resp.text
    txid, mid = resp.json()["transaction_id"], resp.json()["message_id"]
    s.ids[f"tx:{mid}"] = txid
    for action in ["check"] * check + (["discard"] if discard else []):
        halves = b.http.get("/internal/v1/transactions/halves", params={"max": 4096},
                            headers=AUTH).json()["entries"]
        entry = [e for e in halves if e["transaction_id"] == txid][-1]
        resp = b.http.post("/internal/v1/transactions/actions", headers=AUTH, json={
            "actions": [{"transaction_id": txid, "physical_offset": entry["physical_offset"],
                         "action": action}]})
        assert resp.status_code == 200, resp.text
    return str(mid)


@pytest.fixture(scope="module")
def page(system: System) -> Iterator[Any]:
    with playwright_api.sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=ARGS)
        pg = browser.new_page(viewport={"width": 1280, "height": 800})
        pg.set_default_timeout(10_000)
        errors: list[str] = []
        pg.on("console", lambda msg: errors.append(msg.text) if msg.type == "error" else None)
        pg.on("pageerror", lambda exc: errors.append(str(exc)))
        pg.errors = errors
        yield pg
        browser.close()
    assert not errors, errors


def _open(page: Any, s: System, path: str, shot: str = "") -> None:
    resp = page.goto(s.console.url + path)
    assert resp.status == 200, resp.status
    assert page.locator(".error").count() == 0, page.locator(".error").all_inner_texts()
    if shot:
        SHOTS.mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(SHOTS / f"{shot}.png"), full_page=True)


def _sampled(system: System, rounds: int = 2) -> None:
    """Wait until the console has sampled the brokers ``rounds`` more times (its /metrics)."""
    def count() -> float:
        text = httpx.get(system.console.url + "/metrics").text
        return sum(float(line.split()[-1]) for line in text.splitlines()
                   if line.startswith("tidemq_console_sample_rounds_total "))
    start = count()
    wait_until(lambda: count() >= start + rounds, 15, "console samples")


def _rates_show_traffic(page: Any, system: System, path: str, row: Any, shot: str) -> None:
    """Send to and pull from queue 1 of the test topic while reloading ``path`` until the send
    and receive rates in ``row`` are above zero (a rate spans the console's last two samples)."""
    def value(cell: str) -> float:
        shown = str(row.locator(f"td.{cell}").inner_text())
        assert shown == "—" or shown.endswith("/s"), shown
        return 0.0 if shown == "—" else float(shown.split("/")[0].replace(",", ""))

    deadline = time.monotonic() + 15
    while time.monotonic() < deadline:
        system.broker.send(system.topic, *({"body": f"rate {i}", "queue_id": 1}
                                           for i in range(10)))
        assert system.broker.pull(system.topic, 1, 0, max=10)["messages"]
        _open(page, system, path)
        if value("send") > 0 and value("receive") > 0:
            page.screenshot(path=str(SHOTS / f"{shot}.png"), full_page=True)
            return
        time.sleep(0.2)
    raise AssertionError("the send or receive rate stayed at zero during traffic")


def test_cluster_view(page: Any, system: System) -> None:
    _sampled(system)
    row = page.locator("tr.broker")
    _rates_show_traffic(page, system, "/", row, "cluster")
    assert row.count() == 1
    assert system.broker.url in row.inner_text() and "primary" in row.inner_text()
    assert "ok" in row.inner_text()
    assert row.locator("td.role").inner_text() == "primary"
    assert row.locator("td.epoch").inner_text() == "0"
    assert row.locator("td.broker-id").inner_text() == "0"
    assert "iB" in row.locator("td.log").inner_text()  # the commit log holds the seeded data
    assert row.locator("td.disk").inner_text().endswith("%")
    assert row.locator("td.uptime").inner_text()[-1] in "sm"  # e.g. 0m42s, from its /metrics
    assert "scheduler" in page.locator("main").inner_text()


def test_cluster_view_shows_each_member_with_role_epoch_and_id(page: Any,
                                                               system: System) -> None:
    """What GET /v1/cluster gives is shown: a replica registered beside the primary (at an
    address where nothing answers, so its health shows the failure)."""
    dead = f"http://127.0.0.1:{free_port()}"
    heartbeat = {"cluster": system.cluster, "broker_name": "broker-a", "address": dead,
                 "broker_id": 2, "role": "replica", "epoch": 7, "topics": {}}
    resp = httpx.post(f"{system.nameserver}/v1/brokers/heartbeat", json=heartbeat,
                      headers=AUTH)
    assert resp.status_code == 200, resp.text
    try:
        _open(page, system, "/")
        rows = page.locator("tr.broker")
        assert rows.count() == 2
        replica = page.locator("tr.broker", has_text=dead)
        assert replica.locator("td.role").inner_text() == "replica"
        assert replica.locator("td.epoch").inner_text() == "7"
        assert replica.locator("td.broker-id").inner_text() == "2"
        assert "UNAVAILABLE" in replica.inner_text()  # its health check failed, and says so
    finally:
        resp = httpx.delete(f"{system.nameserver}/v1/brokers/broker-a",
                            params={"broker_id": 2}, headers=AUTH)
        assert resp.status_code == 200, resp.text


def test_topics_view_and_create(page: Any, system: System) -> None:
    _open(page, system, "/topics")
    page.click(f"a:text-is('{system.topic}')")
    offsets = page.locator("table.offsets").inner_text()
    for q in system.broker.http.get(f"/v1/topics/{system.topic}").json()["offsets"]:
        assert f"\t{q['queue_id']}\t{q['min']}\t{q['max']}\t" in offsets, (q, offsets)
    _rates_show_traffic(page, system, f"/topics?topic={system.topic}",
                        page.locator("table.topics tr", has_text=system.topic), "topics")
    new = unique("Created")
    page.fill("#create-topic input[name=topic]", new)
    page.fill("#create-topic input[name=queues]", "3")
    page.click("#create-topic button")
    assert "created" in page.locator(".done").inner_text()
    info = system.broker.http.get(f"/v1/topics/{new}").json()
    assert info["queues"] == 3


def test_groups_view_and_reset(page: Any, system: System) -> None:
    _sampled(system, 3)
    _open(page, system, f"/groups?group={system.group}", "groups")
    assert system.group in page.locator("table.groups").inner_text()
    lag = int(page.locator("h2").first.inner_text().split("total lag ")[1].rstrip(")"))
    assert lag >= 3  # 3 seeded behind queue 1, plus what the rate tests sent
    assert page.locator("svg.lagchart rect").count() == 1
    listed = page.locator("table.groups tr", has_text=system.group)
    assert listed.locator("svg.spark polyline").count() == 1  # lag over time in the list too
    dots = page.locator("svg.lagline circle")
    assert dots.count() >= 3  # lag over time: one dot per sample
    assert f"lag {lag}" in dots.last.locator("title").text_content()
    page.fill("#reset input[name=topic]", system.topic)
    page.click("#reset button")
    assert "Confirm" in page.locator("h1").inner_text()
    page.click("#confirm button")
    assert "reset" in page.locator(".done").inner_text()
    offsets = system.broker.http.get(f"/v1/groups/{system.group}/offsets").json()["offsets"]
    ends = {q["queue_id"]: q["max"] for q in
            system.broker.http.get(f"/v1/topics/{system.topic}").json()["offsets"]}
    assert {(o["queue_id"], o["offset"]) for o in offsets} == set(ends.items())
    assert all(o["lag"] == 0 for o in offsets)
    _sampled(system, 1)
    page.goto(system.console.url + f"/groups?group={system.group}")
    assert "lag 0" in page.locator("svg.lagline circle").last.locator("title").text_content()


def test_messages_view(page: Any, system: System) -> None:
    _open(page, system, f"/messages?id={system.ids['json']}")
    text = page.locator("#message").inner_text()
    assert "source" in text and "order-42" in text and "stored" in text
    page.click("button[data-tab=json]")
    assert '"paid": true' in page.locator("pre[data-body=json]").inner_text()
    page.click("button[data-tab=hex]")
    assert page.locator("pre[data-body=hex]").inner_text().startswith("7b")
    trace = page.locator("ol.trace").inner_text()
    assert f"stored in {system.topic} queue 0 offset 0" in trace
    otel = page.locator("p.otel").inner_text()  # the trace id its traceparent carries
    assert "OpenTelemetry trace 4bf92f3577b34da6a3ce929d0e0e4736" in otel
    assert "span 00f067aa0ba902b7" in otel
    assert f"consumed by group {system.audit}" in trace
    _open(page, system, f"/messages?topic={system.topic}&key=order-42")
    assert system.ids["json"] in page.locator("table.results").inner_text()
    page.goto(system.console.url + "/messages?id=no-such-message")
    assert "MESSAGE_NOT_FOUND" in page.locator(".error").inner_text()  # shown, not blank


def test_full_trace_of_a_checked_committed_transaction(page: Any, system: System) -> None:
    _open(page, system, f"/messages?id={system.ids['checked']}")
    steps = page.locator("ol.trace li").all_inner_texts()
    assert steps[0].startswith("half message stored"), steps
    assert steps[1].startswith("checked back 2 time(s)"), steps
    assert steps[2].startswith("committed"), steps
    assert any(s.startswith(f"stored in {system.topic}") for s in steps), steps
    page.click("details summary")
    assert page.locator("table.copies tr", has_text="half").count() == 3
    details = [t.strip() for t in page.locator("table.copies tr td:last-child").all_inner_texts()]
    assert details == ["checks 0", "checks 1", "checks 2", ""], details
    page.screenshot(path=str(SHOTS / "messages.png"), full_page=True)


def test_transactions_view(page: Any, system: System) -> None:
    _open(page, system, "/transactions", "transactions")
    pending = page.locator("main").inner_text()
    assert system.producer_group in pending and system.ids["half"] in pending
    discarded = page.locator("table.discarded").inner_text()
    assert system.ids["to-commit"] in discarded and system.ids["to-drop"] in discarded
    row = page.locator("table.discarded tr", has_text=system.ids["to-commit"])
    assert system.ids["tx:" + system.ids["to-commit"]] in row.inner_text()


def _resolve(page: Any, system: System, mid: str, action: str) -> None:
    page.goto(system.console.url + "/transactions")
    row = page.locator("table.discarded tr", has_text=mid)
    row.locator(f"button[value={action}]").click()
    assert "Confirm" in page.locator("h1").inner_text()  # a confirmation step first
    assert mid in page.locator("main").inner_text()
    page.click("#confirm button")
    done = page.locator(".done").inner_text()
    assert system.ids[f"tx:{mid}"] in done, done


def test_resolving_discarded_transactions(page: Any, system: System) -> None:
    b, committed, dropped = system.broker, system.ids["to-commit"], system.ids["to-drop"]
    _resolve(page, system, committed, "commit")
    assert b.http.get(f"/v1/messages/{committed}").json()["state"] == "committed"
    view = b.http.get(f"/v1/transactions/{system.ids['tx:' + committed]}").json()
    assert view["state"] == "discarded" and view["resolution"] == "committed"
    found = b.http.get("/v1/messages", params={"topic": system.topic, "begin_ms": 0,
                                               "end_ms": 2**41, "max": 1024}).json()
    assert [m["message_id"] for m in found["messages"]].count(committed) == 1
    _resolve(page, system, dropped, "drop")
    assert b.http.get(f"/v1/transactions/{system.ids['tx:' + dropped]}").json()[
        "resolution"] == "dropped"
    assert b.http.get(f"/v1/messages/{dropped}").json()["state"] == "discarded"
    page.goto(system.console.url + "/transactions")
    cells = page.locator("table.discarded td.resolution").all_inner_texts()
    assert "committed" in cells and "dropped" in cells
    page.goto(system.console.url + f"/messages?id={dropped}")
    assert "resolved by an operator: dropped" in page.locator("ol.trace").inner_text()


def test_a_refused_resolve_is_shown_in_the_page(page: Any, system: System) -> None:
    mid = system.ids["conflict"]
    page.goto(system.console.url + "/transactions")
    page.locator("table.discarded tr", has_text=mid).locator("button[value=commit]").click()
    assert "Confirm" in page.locator("h1").inner_text()
    resp = system.broker.http.post(f"/v1/transactions/{system.ids['tx:' + mid]}/resolve",
                                   json={"action": "drop"})  # somebody else, meanwhile
    assert resp.status_code == 200, resp.text
    page.click("#confirm button")
    assert "TRANSACTION_ALREADY_ENDED" in page.locator(".error").inner_text()
    assert system.broker.http.get(f"/v1/messages/{mid}").json()["state"] == "discarded"


def test_timers_view_and_cancel(page: Any, system: System) -> None:
    wait_until(lambda: system.broker.http.get("/v1/scheduled/histogram").json()["timers"] >= 4,
               15, "the timers taken in by the scheduler")
    _open(page, system, "/timers", "timers")
    assert int(page.locator("td.pending").first.inner_text()) >= 1
    day = time.strftime("%Y-%m-%d", time.gmtime(system.day0 / 1000))
    next_day = time.strftime("%Y-%m-%d", time.gmtime(system.day0 / 1000 + 86_400))
    days = page.locator("svg.histogram.day rect title").all_text_contents()
    assert f"{day} UTC: 2 timer(s)" in days and f"{next_day} UTC: 1 timer(s)" in days, days
    hours = page.locator("svg.histogram.hour rect title").all_text_contents()
    hour = time.strftime("%Y-%m-%d %H:00", time.gmtime(system.timer_due / 1000))
    assert hours[0] == f"{hour} UTC: 1 timer(s)", hours
    # the same id delayed in a second topic: the page cancels the timer it shows, and only it
    twin = system.broker.create_topic(queues=1)
    system.broker.send(twin, {"message_id": system.ids["timer"], "body": "twin",
                              "deliver_at_ms": system.timer_due})
    http = system.broker.http

    def pending(topic: str) -> int:
        return int(http.get("/v1/scheduled", params={"topic": topic}).json()["pending"])

    wait_until(lambda: pending(twin) == 1, 10, "the twin timer counted")
    before = pending(system.topic)
    page.fill("#find-timer input[name=id]", system.ids["timer"])
    page.click("#find-timer button")
    assert page.locator(".state").inner_text() == "scheduled"
    assert twin in page.locator("main").inner_text()  # the newest copy is shown
    page.click("#cancel button")
    assert "cancelled" in page.locator(".done").inner_text()
    assert pending(twin) == 0 and pending(system.topic) == before
    resp = http.delete(f"/v1/messages/{system.ids['timer']}/schedule",
                       params={"topic": system.topic})
    assert resp.status_code == 200, resp.text
    assert pending(system.topic) == before - 1
    m = http.get(f"/v1/messages/{system.ids['timer']}").json()
    assert m["state"] == "cancelled"


def test_dlq_view_and_resend(page: Any, system: System) -> None:
    _open(page, system, f"/dlq?group={system.dlq_group}", "dlq")
    table = page.locator("table.dlq").inner_text()
    assert system.ids["dead"] in table and system.topic in table
    before = now_ms() - 1000
    page.click("table.dlq button")
    assert "1 resent, 0 failed" in page.locator(".done").inner_text()
    found = system.broker.http.get("/v1/messages", params={
        "topic": system.topic, "begin_ms": before, "end_ms": 2**41, "max": 1024}).json()
    copies = [m for m in found["messages"]
              if m["properties"].get("dlq_message_id") == system.ids["dead"]]
    assert len(copies) == 1 and copies[0]["body"] == "poison"


def test_dlq_resend_all_covers_the_whole_dlq(page: Any, system: System) -> None:
    _open(page, system, f"/dlq?group={system.bulk_group}")
    assert page.locator("table.dlq tr").count() == 1 + 50  # the newest page_messages shown
    page.click("#resend-all button")
    assert f"{BULK_DEAD} resent, 0 failed" in page.locator(".done").inner_text()
    info = system.broker.http.get(f"/v1/topics/{system.bulk_topic}").json()
    [q] = info["offsets"]
    assert q["max"] == 2 * BULK_DEAD  # the originals, then one copy of each
    resent = system.broker.pull(system.bulk_topic, 0, BULK_DEAD, max=1024)["messages"]
    assert len({m["properties"]["dlq_message_id"] for m in resent}) == BULK_DEAD


def test_a_resent_dead_letter_is_marked_traced_and_not_resent_again(page: Any,
                                                                    system: System) -> None:
    """After test_dlq_view_and_resend: the entry is marked with its copy's id, the original's
    trace names the copy, and neither Resend all nor the CLI sends it again."""
    dead, b = system.ids["dead"], system.broker
    _open(page, system, f"/dlq?group={system.dlq_group}")
    row = page.locator("table.dlq tr", has_text=dead)
    assert row.get_attribute("class") == "resent"
    copy_id = row.locator("td.resent-as a").inner_text()
    assert copy_id.startswith("dlq-") and len(copy_id) == 44
    assert row.locator("button").is_disabled()
    trace = b.http.get(f"/v1/messages/{dead}/trace").json()
    assert [r["message_id"] for r in trace["resent"]] == [copy_id]
    assert [c.get("resent_as") for c in trace["copies"] if c["kind"] == "dlq"] == [copy_id]
    row.locator("td.resent-as a").click()
    assert b.http.get(f"/v1/messages/{copy_id}").json()["properties"]["dlq_message_id"] == dead
    _open(page, system, f"/messages?id={dead}")
    assert f"resent from the DLQ as {copy_id} to {system.topic}" in page.locator(
        "ol.trace").inner_text()
    _open(page, system, f"/dlq?group={system.dlq_group}")
    page.click("#resend-all button")
    assert "0 resent, 0 failed, 1 resent before (not again)" in page.locator(
        ".done").inner_text()
    result = CliRunner().invoke(cli_app, ["--broker", b.url, "dlq", "resend",
                                          system.dlq_group, "--message-id", dead, "--json"])
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["earlier"] is True
    found = b.http.get("/v1/messages", params={"topic": system.topic, "begin_ms": 0,
                                               "end_ms": 2**41, "max": 1024}).json()
    assert [m["message_id"] for m in found["messages"]
            if m["properties"].get("dlq_message_id") == dead] == [copy_id]


def test_an_unreachable_nameserver_is_shown_in_the_page(page: Any, system: System,
                                                        tmp_path: Path) -> None:
    port = free_port()
    console = ServiceProcess("console", port, {
        "TIDEMQ_CONSOLE_PORT": str(port),
        "TIDEMQ_CONSOLE_NAMESERVERS": f"http://127.0.0.1:{free_port()}"}, tmp_path).start()
    try:
        page.goto(console.url + "/topics")
        assert "UNAVAILABLE" in page.locator(".error").inner_text()
        assert httpx.get(console.url + "/healthz").json() == {"status": "ok"}
    finally:
        console.stop()
