"""The console's forms and pages refuse what they do not understand instead of guessing (real
nameserver, broker and console, driven over HTTP like a browser posting its forms).

- the offset reset "to time" without a time, or to anything but latest/time, shows the form's
  error and no confirmation (never a plan at the latest offsets);
- ``/messages`` takes the REST API's names too (``message_id``, ``begin_ms``/``end_ms``), and
  every page names a query parameter it did not understand.
"""

from __future__ import annotations

import html
import re
from collections.abc import Iterator
from contextlib import ExitStack
from dataclasses import dataclass

import httpx
import pytest

from tests.support.broker import TOKEN, BrokerHandle, run_broker, unique
from tests.support.procs import RedisServer, ServiceProcess, free_port

pytestmark = pytest.mark.integration


@dataclass
class Setup:
    console: ServiceProcess
    broker: BrokerHandle
    topic: str
    message_id: str
    group: str


@pytest.fixture(scope="module")
def setup(tmp_path_factory: pytest.TempPathFactory,
          redis_server: RedisServer) -> Iterator[Setup]:
    work = tmp_path_factory.mktemp("console-forms")
    with ExitStack() as stack:
        ns_port = free_port()
        ns = ServiceProcess("nameserver", ns_port, {
            "TIDEMQ_NAMESRV_PORT": str(ns_port), "TIDEMQ_NAMESRV_TOKEN": TOKEN}, work)
        stack.callback(ns.start().stop)
        broker = stack.enter_context(run_broker(work, redis_server.url, nameservers=ns.url,
                                                register_interval_s=1))
        console_port = free_port()
        console = ServiceProcess("console", console_port, {
            "TIDEMQ_CONSOLE_PORT": str(console_port), "TIDEMQ_CONSOLE_NAMESERVERS": ns.url,
            "TIDEMQ_CONSOLE_TOKEN": TOKEN}, work)
        stack.callback(console.start().stop)
        topic, group = broker.create_topic(queues=1), unique("billing")
        [sent] = broker.send(topic, {"message_id": unique("order"), "body": "order 42",
                                     "keys": ["order-42"]})
        resp = broker.http.put(f"/v1/groups/{group}/offsets", json={"offsets": [
            {"topic": topic, "queue_id": 0, "offset": 0}]})
        assert resp.status_code == 200, resp.text
        yield Setup(console, broker, topic, sent["message_id"], group)


def _csrf(html: str) -> str:
    found = re.search(r'name="csrf" value="([^"]+)"', html)
    assert found, html[:2000]
    return found.group(1)


def _shown(page: str, css: str) -> str:
    found = re.search(rf'<div class="{css}"[^>]*>(.*?)</div>', page, re.S)
    return html.unescape(found.group(1)) if found else ""


@pytest.mark.parametrize(("to", "at", "named"), [("time", "", "at:"), ("time", "  ", "at:"),
                                                 ("yesterday", "", "to:")])
def test_a_reset_without_a_target_shows_the_error_not_a_plan(setup: Setup, to: str, at: str,
                                                             named: str) -> None:
    with httpx.Client(base_url=setup.console.url, timeout=20.0) as http:
        csrf = _csrf(http.get("/groups", params={"group": setup.group}).text)
        page = http.post("/groups/reset", headers={"Origin": setup.console.url}, data={
            "csrf": csrf, "group": setup.group, "topic": setup.topic, "to": to, "at": at})
    assert page.status_code == 200, page.text
    error = _shown(page.text, "error")
    assert error.startswith("BAD_REQUEST: " + named), error or page.text[:3000]
    assert 'name="token"' not in page.text and "new offset" not in page.text


def test_a_reset_to_a_time_still_plans(setup: Setup) -> None:
    with httpx.Client(base_url=setup.console.url, timeout=20.0) as http:
        csrf = _csrf(http.get("/groups", params={"group": setup.group}).text)
        page = http.post("/groups/reset", headers={"Origin": setup.console.url}, data={
            "csrf": csrf, "group": setup.group, "topic": setup.topic, "to": "time",
            "at": "2000-01-01T00:00:00"})
    assert _shown(page.text, "error") == "" and 'name="token"' in page.text
    assert re.search(r"<td>0</td><td>0</td></tr>", page.text), page.text  # queue 0, offset 0


def test_messages_takes_the_api_names_too(setup: Setup) -> None:
    with httpx.Client(base_url=setup.console.url, timeout=20.0) as http:
        by_alias = http.get("/messages", params={"message_id": setup.message_id})
        searched = http.get("/messages", params={"topic": setup.topic, "key": "order-42",
                                                 "begin_ms": "0", "end_ms": "9999999999999"})
    for page in (by_alias, searched):
        assert page.status_code == 200
        assert _shown(page.text, "error") == "" and 'id="ignored-query"' not in page.text
    assert "order 42" in by_alias.text and f'value="{setup.message_id}"' in by_alias.text
    assert "1 message(s)" in searched.text and setup.message_id in searched.text


def test_every_page_names_a_parameter_it_did_not_understand(setup: Setup) -> None:
    with httpx.Client(base_url=setup.console.url, timeout=20.0) as http:
        page = http.get("/messages", params={"mesage_id": setup.message_id})
        note = _shown(page.text, 'warning" id="ignored-query')
        assert "'mesage_id'" in note and "id (or message_id)" in note, page.text[:3000]
        for path in ("/", "/topics", "/groups", "/transactions", "/timers", "/dlq"):
            shown = _shown(http.get(path, params={"bogus": "1"}).text,
                           'warning" id="ignored-query')
            assert "'bogus'" in shown, path
        assert 'id="ignored-query"' not in http.get(
            "/groups", params={"group": setup.group, "done": "ok"}).text
