"""Every primary etcd announces for broker-a, as it happens: a watch on the group's ``primary``
key over etcd's JSON gateway (``POST /v3/watch``), from the controller. Each put (an election
won: the new primary's address and epoch) becomes a ``RoleSample`` stamped when the controller
saw it, beside the members' sampled roles: the split-brain check then uses every epoch change,
even one whose primary lasted less than a sampling interval."""

from __future__ import annotations

import base64
import json
import threading
from typing import Any

import httpx

from bench._faults.history import RoleSample, now_ms

RECONNECT_S = 0.5  # a broken watch is opened again after this (s)
# the etcd key holding a group's primary claim (the broker's GroupKeys.primary, election.py;
# tests/bench/faults/test_checker.py holds them equal)
PRIMARY_KEY = "/tidemq/{cluster}/{group}/primary"


def announcement(event: dict[str, Any], group: str) -> RoleSample | None:
    """The sample an etcd watch event stands for (None: a delete, or not a claim)."""
    if event.get("type") == "DELETE":
        return None
    try:
        claim = json.loads(base64.b64decode(event["kv"]["value"]))
        return RoleSample(now_ms(), group, str(claim["address"]), "primary", int(claim["epoch"]))
    except (KeyError, ValueError, TypeError):
        return None


class PrimaryWatch:
    def __init__(self, etcd_url: str, cluster: str, group: str) -> None:
        self.url = etcd_url
        self.group = group
        self.key = PRIMARY_KEY.format(cluster=cluster, group=group)
        self.samples: list[RoleSample] = []
        self.errors = 0
        self.done = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True,
                                        name=f"faults-etcd-watch-{group}")
        self._revision = 0  # the last revision seen: a reopened watch goes on after it

    def start(self) -> PrimaryWatch:
        self._thread.start()
        return self

    def _run(self) -> None:
        key = base64.b64encode(self.key.encode()).decode()
        while not self.done.is_set():
            create: dict[str, Any] = {"key": key}
            if self._revision:
                create["start_revision"] = self._revision + 1
            try:
                with httpx.stream("POST", f"{self.url}/v3/watch",
                                  json={"create_request": create},
                                  timeout=httpx.Timeout(5.0, read=None)) as resp:
                    for line in resp.iter_lines():
                        if self.done.is_set():
                            return
                        self._take(line)
            except (httpx.HTTPError, ValueError):
                self.errors += 1
            self.done.wait(RECONNECT_S)

    def _take(self, line: str) -> None:
        if not line.strip():
            return
        result = json.loads(line).get("result", {})
        for event in result.get("events", []):
            self._revision = max(self._revision, int(event["kv"].get("mod_revision", 0)))
            sample = announcement(event, self.group)
            if sample is not None:
                self.samples.append(sample)
