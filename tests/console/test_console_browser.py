"""The web console end to end: real nameserver, broker, scheduler and console processes, driven
in Debian's headless Chromium through Playwright. Each view shows what the test created over
REST; cancelling a timer and resending a dead letter through the pages take effect (checked over
REST); the browser console stays free of errors. Writes a screenshot of each view to
docs/console/ (the README shows one)."""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.support.broker import TOKEN, BrokerHandle, run_broker, unique
from tests.support.procs import REPO, RedisServer, ServiceProcess, free_port

pytestmark = pytest.mark.integration

playwright_api = pytest.importorskip("playwright.sync_api")
CHROMIUM = "/usr/bin/chromium"
SHOTS = REPO / "docs" / "console"
ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking",
        "--disable-component-update", "--disable-sync", "--no-first-run"]


class System:
    def __init__(self, broker: BrokerHandle, console: ServiceProcess) -> None:
        self.broker, self.console = broker, console
        self.topic = unique("Orders")
        self.group = unique("billing")
        self.dlq_group = unique("dlqg")
        self.producer_group = unique("orders-tx")
        self.ids: dict[str, str] = {}


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
            "TIDEMQ_CONSOLE_TOKEN": TOKEN,
            "TIDEMQ_CONSOLE_SCHEDULERS": sched.url}, workdir)
        stack.callback(console.start().stop)
        s = System(broker, console)
        _seed(s)
        yield s


def _seed(s: System) -> None:
    b = s.broker
    b.create_topic(s.topic, queues=2)
    s.ids["json"] = b.send(s.topic, {"message_id": unique("m"), "body": json.dumps(
        {"order": 42, "paid": True}), "keys": ["order-42"], "tag": "Paid",
        "properties": {"source": "web"}, "queue_id": 0})[0]["message_id"]
    b.send(s.topic, *({"body": f"filler {i}", "queue_id": 1} for i in range(5)))
    s.ids["timer"] = unique("pay-check")
    b.send(s.topic, {"message_id": s.ids["timer"], "body": "check payment",
                     "delay_ms": 3_600_000})
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


def test_cluster_view(page: Any, system: System) -> None:
    _open(page, system, "/", "cluster")
    row = page.locator("tr.broker")
    assert row.count() == 1
    assert system.broker.url in row.inner_text() and "primary" in row.inner_text()
    assert "ok" in row.inner_text()
    assert "scheduler" in page.locator("main").inner_text()


def test_topics_view_and_create(page: Any, system: System) -> None:
    _open(page, system, "/topics")
    page.click(f"a:text-is('{system.topic}')")
    offsets = page.locator("table.offsets").inner_text()
    assert "0\t0\t2" in offsets.replace(" ", "") or "\t0\t2\t" in offsets  # queue 0: 0..2
    assert "5" in offsets
    _open(page, system, f"/topics?topic={system.topic}", "topics")
    new = unique("Created")
    page.fill("#create-topic input[name=topic]", new)
    page.fill("#create-topic input[name=queues]", "3")
    page.click("#create-topic button")
    assert "created" in page.locator(".done").inner_text()
    info = system.broker.http.get(f"/v1/topics/{new}").json()
    assert info["queues"] == 3


def test_groups_view_and_reset(page: Any, system: System) -> None:
    _open(page, system, f"/groups?group={system.group}", "groups")
    assert system.group in page.locator("table.groups").inner_text()
    assert "total lag 3" in page.locator("h2").first.inner_text()
    assert page.locator("svg.lagchart rect").count() == 1
    page.fill("#reset input[name=topic]", system.topic)
    page.click("#reset button")
    assert "Confirm" in page.locator("h1").inner_text()
    page.click("#confirm button")
    assert "reset" in page.locator(".done").inner_text()
    offsets = system.broker.http.get(f"/v1/groups/{system.group}/offsets").json()["offsets"]
    assert {(o["queue_id"], o["offset"]) for o in offsets} >= {(1, 5)}
    assert all(o["lag"] == 0 for o in offsets)


def test_messages_view(page: Any, system: System) -> None:
    _open(page, system, f"/messages?id={system.ids['json']}", "messages")
    text = page.locator("#message").inner_text()
    assert "source" in text and "order-42" in text and "stored" in text
    page.click("button[data-tab=json]")
    assert '"paid": true' in page.locator("pre[data-body=json]").inner_text()
    page.click("button[data-tab=hex]")
    assert page.locator("pre[data-body=hex]").inner_text().startswith("7b")
    _open(page, system, f"/messages?topic={system.topic}&key=order-42")
    assert system.ids["json"] in page.locator("table.results").inner_text()
    page.goto(system.console.url + "/messages?id=no-such-message")
    assert "MESSAGE_NOT_FOUND" in page.locator(".error").inner_text()  # shown, not blank


def test_transactions_view(page: Any, system: System) -> None:
    _open(page, system, "/transactions", "transactions")
    pending = page.locator("main").inner_text()
    assert system.producer_group in pending and system.ids["half"] in pending


def test_timers_view_and_cancel(page: Any, system: System) -> None:
    _open(page, system, "/timers", "timers")
    assert int(page.locator("td.pending").first.inner_text()) >= 1
    page.fill("#find-timer input[name=id]", system.ids["timer"])
    page.click("#find-timer button")
    assert page.locator(".state").inner_text() == "scheduled"
    page.click("#cancel button")
    assert "cancelled" in page.locator(".done").inner_text()
    m = system.broker.http.get(f"/v1/messages/{system.ids['timer']}").json()
    assert m["state"] == "cancelled"


def test_dlq_view_and_resend(page: Any, system: System) -> None:
    _open(page, system, f"/dlq?group={system.dlq_group}", "dlq")
    table = page.locator("table.dlq").inner_text()
    assert system.ids["dead"] in table and system.topic in table
    page.click("table.dlq button")
    assert "1 resent, 0 failed" in page.locator(".done").inner_text()
    found = system.broker.http.get("/v1/messages", params={
        "topic": system.topic, "begin_ms": 0, "end_ms": 2**41}).json()["messages"]
    copies = [m for m in found if m["properties"].get("dlq_message_id") == system.ids["dead"]]
    assert len(copies) == 1 and copies[0]["body"] == "poison"


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
