"""The console is safe to open to a browser: real nameserver and broker with ACL on, and the
console with ACL and TLS, driven by httpx and by Debian's headless Chromium (Playwright).

- a cross-site form (another ``Origin``, no CSRF token) changes nothing, signed in or not;
- with ACL on the console asks for an access key and secret, and then acts as that account:
  a consumer account is refused a message lookup (cluster admin) the admin account may do;
- the session cookie is ``HttpOnly``, ``SameSite=Strict`` and ``Secure`` under TLS;
- an offset reset is confirmed by a one-time token holding the plan shown: used twice, the
  second is refused and commits nothing;
- without ACL the console says so on every page, answers only to a loopback ``Host`` and
  refuses to bind anywhere but loopback.
"""

from __future__ import annotations

import re
import shutil
from collections.abc import Iterator
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.support.acl import USERS, auth_of, write_acl
from tests.support.broker import TOKEN, unique
from tests.support.procs import RedisServer, ServiceProcess, free_port
from tidemq_server.cli.certs import ensure_dev_pki

pytestmark = pytest.mark.integration

playwright_api = pytest.importorskip("playwright.sync_api")
CHROMIUM = "/usr/bin/chromium"
ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking",
        "--disable-component-update", "--disable-sync", "--no-first-run"]
EVIL = "https://evil.example"


@dataclass
class Setup:
    console: ServiceProcess
    open_console: ServiceProcess  # the same cluster, console without ACL
    broker: str
    nameserver: str
    work: Path
    topic: str
    secret_id: str
    admin: httpx.Client

    def offsets(self, group: str) -> dict[int, int]:
        answer = self.admin.get(f"{self.broker}/v1/groups/{group}/offsets",
                                params={"topic": self.topic}).json()
        return {o["queue_id"]: o["offset"] for o in answer["offsets"]}

    def max_offsets(self) -> dict[int, int]:
        info = self.admin.get(f"{self.broker}/v1/topics/{self.topic}").json()
        return {q["queue_id"]: q["max"] for q in info["offsets"]}


def _env(prefix: str, acl_file: Path, **values: str) -> dict[str, str]:
    ak, sk, _ = USERS["services"]
    return {f"{prefix}{k}": v for k, v in {
        "TOKEN": TOKEN, "ACL_FILE": str(acl_file), "ACCESS_KEY": ak, "SECRET_KEY": sk,
        **values}.items()}


@pytest.fixture(scope="module")
def setup(tmp_path_factory: pytest.TempPathFactory,
          redis_server: RedisServer) -> Iterator[Setup]:
    work = tmp_path_factory.mktemp("console-security")
    acl_file = work / "acl.yaml"
    write_acl(acl_file)
    pki = ensure_dev_pki(work / "pki")
    with ExitStack() as stack:
        ns_port, broker_port, console_port = free_port(), free_port(), free_port()
        ns = ServiceProcess("nameserver", ns_port, _env(
            "TIDEMQ_NAMESRV_", acl_file, PORT=str(ns_port)), work)
        stack.callback(ns.start().stop)
        broker = ServiceProcess("broker", broker_port, _env(
            "TIDEMQ_BROKER_", acl_file, PORT=str(broker_port), DATA_DIR=str(work / "broker"),
            CLUSTER=unique("cluster"), REDIS_URL=redis_server.url, NAMESERVERS=ns.url,
            REGISTER_INTERVAL_S="1"), work)
        stack.callback(broker.start().stop)
        console = ServiceProcess("console", console_port, {
            **_env("TIDEMQ_CONSOLE_", acl_file, PORT=str(console_port), NAMESERVERS=ns.url,
                   TLS_CERT=str(pki.cert), TLS_KEY=str(pki.key)),
            "TIDEMQ_TLS_CA": str(pki.ca)}, work)
        stack.callback(console.start().stop)
        open_port = free_port()
        open_console = ServiceProcess("console", open_port, {
            "TIDEMQ_CONSOLE_PORT": str(open_port), "TIDEMQ_CONSOLE_NAMESERVERS": ns.url,
            "TIDEMQ_CONSOLE_TOKEN": TOKEN}, work)
        stack.callback(open_console.start().stop)
        admin = stack.enter_context(httpx.Client(timeout=20.0, auth=auth_of("admin")))
        topic = unique("orders-eu")
        assert admin.put(f"{broker.url}/v1/topics/{topic}", json={"queues": 2}).status_code == 200
        secret = "orders-secret"
        assert admin.put(f"{broker.url}/v1/topics/{secret}",
                         json={"queues": 1}).status_code == 200
        sent = admin.post(f"{broker.url}/v1/topics/{secret}/messages", json={"messages": [
            {"message_id": unique("salary"), "body": "the salaries of everyone"}]})
        assert sent.status_code == 200, sent.text
        resp = admin.post(f"{broker.url}/v1/topics/{topic}/messages", json={"messages": [
            {"body": f"order {i}", "queue_id": i % 2} for i in range(6)]})
        assert resp.status_code == 200, resp.text
        resp = admin.put(f"{broker.url}/v1/groups/billing/offsets", json={"offsets": [
            {"topic": topic, "queue_id": 0, "offset": 0},
            {"topic": topic, "queue_id": 1, "offset": 0}]})
        assert resp.status_code == 200, resp.text
        yield Setup(console, open_console, broker.url, ns.url, work, topic,
                    sent.json()["results"][0]["message_id"], admin)


def _client(s: Setup) -> httpx.Client:
    return httpx.Client(base_url=s.console.url, verify=s.console.verify(), timeout=20.0)


def _csrf(html: str) -> str:
    found = re.search(r'name="csrf" value="([^"]+)"', html)
    assert found, html[:2000]
    return found.group(1)


def _sign_in(http: httpx.Client, user: str) -> str:
    """Sign ``http`` in as ``user`` through the form; the session's CSRF token."""
    ak, sk, _ = USERS[user]
    csrf = _csrf(http.get("/login").text)
    resp = http.post("/login", data={"csrf": csrf, "access_key": ak, "secret_key": sk,
                                     "next": "/"})
    assert resp.status_code == 303 and resp.headers["location"] == "/", resp.text
    return _csrf(http.get("/").text)


def test_the_cross_site_requests_of_the_issue_change_nothing(setup: Setup) -> None:
    before = setup.offsets("billing")
    created = unique("evil")
    with _client(setup) as http:
        reset = http.post("/groups/reset", headers={"Origin": EVIL}, data={
            "group": "billing", "topic": setup.topic, "to": "latest", "at": "",
            "confirm": "yes"})
        create = http.post("/topics", headers={"Origin": EVIL},
                           data={"broker": "broker-a", "topic": created, "queues": "1"})
        lookup = http.get("/messages", params={"id": setup.secret_id})
    assert reset.status_code == 403 and create.status_code == 403
    assert lookup.status_code == 303 and lookup.headers["location"].startswith("/login?next=")
    assert "salaries" not in lookup.text
    assert setup.offsets("billing") == before
    topics = setup.admin.get(f"{setup.broker}/v1/topics").json()["topics"]
    assert created not in str(topics)


def test_a_signed_in_form_needs_this_origin_and_the_session_token(setup: Setup) -> None:
    with _client(setup) as http:
        csrf = _sign_in(http, "admin")
        forged = unique("forged")
        resp = http.post("/topics", headers={"Origin": EVIL},
                         data={"csrf": csrf, "broker": "broker-a", "topic": forged})
        assert resp.status_code == 403 and "evil.example" in resp.json()["message"]
        resp = http.post("/topics", headers={"Origin": setup.console.url},
                         data={"broker": "broker-a", "topic": forged})
        assert resp.status_code == 403 and "CSRF" in resp.json()["message"]
        resp = http.post("/topics", headers={"Sec-Fetch-Site": "cross-site"},
                         data={"csrf": csrf, "broker": "broker-a", "topic": forged})
        assert resp.status_code == 403
        assert setup.admin.get(f"{setup.broker}/v1/topics/{forged}").status_code == 404
        resp = http.post("/topics", headers={"Origin": setup.console.url},
                         data={"csrf": csrf, "broker": "broker-a", "topic": forged})
        assert resp.status_code == 303 and "created" in resp.headers["location"]
    assert setup.admin.get(f"{setup.broker}/v1/topics/{forged}").status_code == 200


def test_the_session_cookie_is_httponly_strict_and_secure_under_tls(setup: Setup) -> None:
    with _client(setup) as http:
        cookie = http.get("/login").headers["set-cookie"]
    attrs = {a.strip().lower() for a in cookie.split(";")}
    assert {"httponly", "samesite=strict", "secure"} <= attrs, cookie


@pytest.fixture
def browser() -> Iterator[Any]:
    if not shutil.which(CHROMIUM):
        pytest.fail(f"{CHROMIUM} is missing: run scripts/install-system-deps.sh")
    with playwright_api.sync_playwright() as pw:
        chromium = pw.chromium.launch(executable_path=CHROMIUM, args=ARGS)
        yield chromium
        chromium.close()


def _page(browser: Any) -> Any:
    context = browser.new_context(ignore_https_errors=True)
    page = context.new_page()
    page.set_default_timeout(10_000)
    return page


def _browser_sign_in(page: Any, user: str, secret: str | None = None) -> None:
    ak, sk, _ = USERS[user]
    page.fill("#login input[name=access_key]", ak)
    page.fill("#login input[name=secret_key]", sk if secret is None else secret)
    page.click("#login button")


def test_the_console_acts_as_the_signed_in_account(setup: Setup, browser: Any) -> None:
    page = _page(browser)
    page.goto(f"{setup.console.url}/messages?id={setup.secret_id}")
    assert page.locator("h1").inner_text() == "Sign in"
    _browser_sign_in(page, "consumer", secret="wrong")
    assert "UNAUTHORIZED" in page.locator(".error").inner_text()
    _browser_sign_in(page, "consumer")
    assert page.url.endswith(f"/messages?id={setup.secret_id}")  # back where it was going
    assert "signed in as consumer" in page.locator("#signed-in").inner_text()
    assert "FORBIDDEN" in page.locator(".error").inner_text()
    assert "salaries" not in page.content()
    page.goto(f"{setup.console.url}/topics")
    page.fill("#create-topic input[name=topic]", "orders-by-consumer")
    page.click("#create-topic button")
    assert "FORBIDDEN" in page.locator(".error").inner_text()
    page.click("nav form.who button")  # sign out
    assert page.locator("h1").inner_text() == "Sign in"
    page.goto(f"{setup.console.url}/messages?id={setup.secret_id}")
    _browser_sign_in(page, "admin")
    assert "salaries" in page.locator("#message").inner_text()
    assert page.locator("#open-console").count() == 0  # ACL is on: no open-console warning


def test_a_confirmation_token_works_once(setup: Setup, browser: Any) -> None:
    page = _page(browser)
    page.goto(f"{setup.console.url}/groups?group=billing")
    _browser_sign_in(page, "admin")
    page.fill("#reset input[name=topic]", setup.topic)
    page.click("#reset button")
    assert "Confirm" in page.locator("h1").inner_text()
    token = page.locator("#confirm input[name=token]").input_value()
    csrf = page.locator("#confirm input[name=csrf]").input_value()
    planned = setup.max_offsets()
    page.click("#confirm button")
    assert "reset" in page.locator(".done").inner_text()
    assert setup.offsets("billing") == planned
    sent = setup.admin.post(f"{setup.broker}/v1/topics/{setup.topic}/messages",
                            json={"messages": [{"body": "later", "queue_id": 0}]})
    assert sent.status_code == 200
    again = page.request.post(f"{setup.console.url}/groups/reset/confirm",
                              form={"csrf": csrf, "token": token},
                              headers={"Origin": setup.console.url})
    assert "CONFIRMATION_EXPIRED" in again.text()
    assert setup.offsets("billing") == planned  # not moved to the new end


def test_without_acl_it_says_so_and_stays_on_loopback(setup: Setup) -> None:
    with httpx.Client(base_url=setup.open_console.url, timeout=20.0) as http:
        for path in ("/", "/topics", "/groups", "/messages", "/transactions", "/timers",
                     "/dlq"):
            page = http.get(path)
            assert page.status_code == 200 and 'id="open-console"' in page.text, path
        rebound = http.get("/", headers={"Host": f"evil.example:{setup.open_console.port}"})
        assert rebound.status_code == 403
    port = free_port()
    exposed = ServiceProcess("console", port, {
        "TIDEMQ_CONSOLE_PORT": str(port), "TIDEMQ_CONSOLE_HOST": "0.0.0.0",
        "TIDEMQ_CONSOLE_NAMESERVERS": setup.nameserver}, setup.work)
    with pytest.raises(RuntimeError, match="binds loopback only"):
        exposed.start()
