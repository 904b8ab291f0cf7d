"""Hosts on one machine: each host a Linux network namespace, all on one bridge.

The bridge lives in a namespace of its own (``<run>-sw``), so no packet between hosts crosses
the machine's own network namespace: the machine's iptables (a dockerd's FORWARD policy DROP,
br_netfilter) never see them, and nothing on the machine is changed. The controller (this
process, in the machine's namespace) reaches every host through one more veth on the bridge
(``<run>-ctl``), like Jepsen's control node: partitions never cut it.

Names: every namespace and link starts with ``PREFIX`` and the run's id (the controller's pid),
so that ``clean_leftovers`` can remove what a crashed run left behind (only runs whose pid is
gone) and concurrent runs never share a name. The subnet is private (10.231.N.0/24, N from the
pid) and exists only inside the run's namespaces and the controller's veth.

Faults are applied inside the hosts: a partition drops packets with iptables in each host's own
namespace (silently, as a cut cable; both directions); ``degrade`` loses or slows a host's
packets (``tc netem``, or iptables + a token bucket where the kernel has no netem).
"""

from __future__ import annotations

import os
import re
import subprocess
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

PREFIX = "tmqf"  # every namespace, link and bridge of this harness starts with it
CTL_HOST = 254  # the controller's address on the subnet: .254


def sh(*argv: str, check: bool = True, ns: str | None = None) -> str:
    """Run a command (inside namespace ``ns`` when given); its stdout."""
    cmd = (["ip", "netns", "exec", ns, *argv] if ns else list(argv))
    done = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if check and done.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed ({done.returncode}): {done.stderr.strip()}")
    return done.stdout


def available() -> str | None:
    """None when this machine can make namespace hosts, else why not."""
    if os.geteuid() != 0:
        return "needs root (network namespaces, veth, tc)"
    for tool in ("ip", "iptables", "tc"):
        if subprocess.run(["which", tool], capture_output=True).returncode:
            return f"{tool} is not installed (iproute2, iptables)"
    return None


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def clean_leftovers() -> list[str]:
    """Remove namespaces and links of runs whose controller is gone; the names removed."""
    removed = []
    for line in sh("ip", "netns", "list", check=False).splitlines():
        name = line.split()[0] if line.split() else ""
        m = re.match(rf"{PREFIX}(\d+)-", name)
        if m and not _pid_alive(int(m.group(1))):
            for pid in sh("ip", "netns", "pids", name, check=False).split():
                try:
                    os.kill(int(pid), 9)
                except (ProcessLookupError, ValueError):
                    pass
            sh("ip", "netns", "delete", name, check=False)
            removed.append(name)
    for line in sh("ip", "-o", "link", "show", check=False).splitlines():
        m = re.match(rf"\d+: ({PREFIX}(\d+)-[\w-]+)[@:]", line)
        if m and not _pid_alive(int(m.group(2))):
            sh("ip", "link", "delete", m.group(1), check=False)
            removed.append(m.group(1))
    return removed


@dataclass
class Host:
    """One namespace host: its name (``n1``), namespace, address and veth names."""

    name: str
    ns: str
    ip: str
    veth: str  # inside the host's namespace
    peer: str  # its other end, on the bridge


@dataclass
class Network:
    """The bridge, the hosts and the controller's link; ``close`` removes everything."""

    names: Sequence[str]
    run: str = field(default_factory=lambda: f"{PREFIX}{os.getpid()}")
    hosts: dict[str, Host] = field(default_factory=dict)
    subnet: str = ""
    ctl_ip: str = ""
    _cut: set[tuple[str, str]] = field(default_factory=set)

    def __post_init__(self) -> None:
        third = os.getpid() % 200 + 20
        self.subnet = f"10.231.{third}"
        self.ctl_ip = f"{self.subnet}.{CTL_HOST}"

    @property
    def switch(self) -> str:
        return f"{self.run}-sw"

    def up(self) -> Network:
        clean_leftovers()
        sw = self.switch
        sh("ip", "netns", "add", sw)
        sh("ip", "link", "set", "lo", "up", ns=sw)
        sh("ip", "link", "add", "br0", "type", "bridge", ns=sw)
        sh("ip", "link", "set", "br0", "up", ns=sw)
        for i, name in enumerate(self.names, start=1):
            ns = f"{self.run}-{name}"
            host = Host(name, ns, f"{self.subnet}.{i}", "eth0", f"{self.run}-{name}")
            sh("ip", "netns", "add", ns)
            sh("ip", "link", "set", "lo", "up", ns=ns)
            sh("ip", "link", "add", host.peer, "type", "veth", "peer", "name", f"{host.peer}x")
            sh("ip", "link", "set", f"{host.peer}x", "netns", ns)
            sh("ip", "link", "set", f"{host.peer}x", "name", "eth0", ns=ns)
            sh("ip", "addr", "add", f"{host.ip}/24", "dev", "eth0", ns=ns)
            sh("ip", "link", "set", "eth0", "up", ns=ns)
            sh("ip", "link", "set", host.peer, "netns", sw)
            sh("ip", "link", "set", host.peer, "master", "br0", ns=sw)
            sh("ip", "link", "set", host.peer, "up", ns=sw)
            self.hosts[name] = host
        ctl = f"{self.run}-ctl"  # the controller's leg, in the machine's namespace
        sh("ip", "link", "add", ctl, "type", "veth", "peer", "name", f"{ctl}x")
        sh("ip", "link", "set", f"{ctl}x", "netns", sw)
        sh("ip", "link", "set", f"{ctl}x", "master", "br0", ns=sw)
        sh("ip", "link", "set", f"{ctl}x", "up", ns=sw)
        sh("ip", "addr", "add", f"{self.ctl_ip}/24", "dev", ctl)
        sh("ip", "link", "set", ctl, "up")
        return self

    def close(self) -> None:
        for host in self.hosts.values():
            for pid in sh("ip", "netns", "pids", host.ns, check=False).split():
                try:
                    os.kill(int(pid), 9)
                except (ProcessLookupError, ValueError):
                    pass
            sh("ip", "netns", "delete", host.ns, check=False)
        sh("ip", "link", "delete", f"{self.run}-ctl", check=False)
        sh("ip", "netns", "delete", self.switch, check=False)
        self.hosts.clear()

    def ip(self, name: str) -> str:
        return self.hosts[name].ip

    def exec_argv(self, name: str, argv: Sequence[str]) -> list[str]:
        """``argv`` run inside host ``name``."""
        return ["ip", "netns", "exec", self.hosts[name].ns, *argv]

    # --- partitions -------------------------------------------------------------------------
    def cut(self, a: str, b: str) -> None:
        """Drop every packet between hosts ``a`` and ``b`` (both directions, silently)."""
        for x, y in ((a, b), (b, a)):
            if (x, y) in self._cut:
                continue
            sh("iptables", "-A", "INPUT", "-s", self.ip(y), "-j", "DROP", ns=self.hosts[x].ns)
            self._cut.add((x, y))

    def partition(self, *sides: Iterable[str]) -> None:
        """Cut every host of one side from every host of the others (hosts named in no side
        keep talking to everyone)."""
        groups = [list(s) for s in sides]
        for i, one in enumerate(groups):
            for other in groups[i + 1:]:
                for a in one:
                    for b in other:
                        self.cut(a, b)

    def heal(self) -> None:
        """Every partition and every netem rule removed."""
        for host in self.hosts.values():
            sh("iptables", "-F", "INPUT", ns=host.ns, check=False)
            sh("tc", "qdisc", "del", "dev", "eth0", "root", ns=host.ns, check=False)
        self._cut.clear()

    def degrade(self, name: str, *, loss_pct: float = 0.0, delay_ms: int = 0,
                rate_kbit: int = 0) -> str:
        """Lose and/or slow the packets of host ``name``'s link; what was applied.

        ``tc netem`` when the kernel has it (loss and delay); without it (sch_netem is not in
        every kernel: it is missing on the CI machines of this project) loss is an iptables
        ``statistic`` match dropping that share of the packets arriving at the host, and delay
        becomes a token bucket of ``rate_kbit`` on its link (queueing delay under load)."""
        ns = self.hosts[name].ns
        netem = ["tc", "qdisc", "replace", "dev", "eth0", "root", "netem"]
        if delay_ms:
            netem += ["delay", f"{delay_ms}ms", f"{max(1, delay_ms // 4)}ms"]
        if loss_pct:
            netem += ["loss", f"{loss_pct}%"]
        done = subprocess.run(["ip", "netns", "exec", ns, *netem], capture_output=True)
        if done.returncode == 0:
            return f"netem loss {loss_pct}% delay {delay_ms} ms"
        applied = []
        if loss_pct:
            sh("iptables", "-A", "INPUT", "-m", "statistic", "--mode", "random",
               "--probability", f"{loss_pct / 100:.4f}", "-j", "DROP", ns=ns)
            applied.append(f"iptables loss {loss_pct}%")
        if delay_ms or rate_kbit:
            rate = rate_kbit or 2000
            sh("tc", "qdisc", "replace", "dev", "eth0", "root", "tbf", "rate", f"{rate}kbit",
               "burst", "16kbit", "latency", f"{max(delay_ms, 50)}ms", ns=ns)
            applied.append(f"tbf {rate} kbit/s")
        return ", ".join(applied)
