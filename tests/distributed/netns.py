"""A small network of Linux network namespaces for the two-host test, made and torn down by it.

Every namespace has one veth link (`eth0`) to a bridge in a switch namespace; the test process
itself joins through one more veth pair whose root-side end holds `CLIENT_ADDR`. Addresses come
only from 198.51.100.0/24 (TEST-NET-2, a documentation range) and live only on these veth pairs.
A host's processes also get their own UTS namespace, so `socket.gethostname()` is that host's
name, and (`own_pids`) their own pid namespace and /proc: a pid written on one host names nothing
on another, as between machines.

Needs root (CAP_NET_ADMIN, CAP_SYS_ADMIN); `Network.create` raises when the kernel refuses.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

SUBNET = "198.51.100"
CLIENT_ADDR = f"{SUBNET}.254"


def _ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True, text=True)


@dataclass
class Host:
    """One namespace: a machine with one network interface."""

    ns: str
    name: str  # its hostname
    addr: str
    own_pids: bool = False
    procs: list[subprocess.Popen[bytes]] = field(default_factory=list)

    def _wrap(self, argv: list[str], hostname: str | None = None) -> list[str]:
        pids = ["--pid", "--fork", "--mount", "--mount-proc"] if self.own_pids else []
        return ["ip", "netns", "exec", self.ns, "unshare", "--uts", *pids, "sh", "-c", 'hostname "$0" && exec "$@"',
                hostname or self.name, *argv]

    def popen(self, argv: list[str], *, env: dict[str, str], log: Path) -> subprocess.Popen[bytes]:
        """Start `argv` on this host, in its own process group; stdout and stderr go to `log`."""
        proc = subprocess.Popen(self._wrap(argv), env=env, stdout=log.open("ab"), stderr=subprocess.STDOUT,
                                start_new_session=True)
        self.procs.append(proc)
        return proc

    def run(self, argv: list[str], *, env: dict[str, str], timeout: float = 60,
            hostname: str | None = None) -> subprocess.CompletedProcess[str]:
        """Run `argv` here to its end (`hostname`: as if this host had that name)."""
        return subprocess.run(self._wrap(argv, hostname), env=env, capture_output=True, text=True, timeout=timeout)

    def pids(self) -> list[int]:
        """Every process in this namespace (the kernel's list, not only those this test started)."""
        out = subprocess.run(["ip", "netns", "pids", self.ns], capture_output=True, text=True).stdout
        return [int(p) for p in out.split()]

    def kill_all(self) -> list[int]:
        """SIGKILL every process on this host; returns their pids once they are gone."""
        pids = self.pids()
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        for proc in self.procs:
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                pass
        deadline = time.monotonic() + 10
        while self.pids() and time.monotonic() < deadline:
            time.sleep(0.05)
        return pids

    def kill(self, marker: bytes) -> list[int]:
        """SIGKILL the processes on this host whose command line holds `marker`; returns their pids."""
        killed = []
        for pid in self.pids():
            try:
                if marker in Path(f"/proc/{pid}/cmdline").read_bytes():
                    os.kill(pid, signal.SIGKILL)
                    killed.append(pid)
            except (FileNotFoundError, ProcessLookupError):
                pass
        return killed

    def wait_gone(self, pids: list[int], timeout: float = 10) -> None:
        """Until none of `pids` runs (a zombie, dead but not yet reaped, does not)."""
        def running(pid: int) -> bool:
            try:
                return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
            except (FileNotFoundError, IndexError):
                return False

        deadline = time.monotonic() + timeout
        while any(running(p) for p in pids):
            if time.monotonic() > deadline:
                raise AssertionError(f"processes {pids} on {self.name} still run {timeout}s after SIGKILL")
            time.sleep(0.02)

    def listening(self) -> set[str]:
        """The local addresses of this host's listening TCP sockets (`ss`), as `address:port`."""
        out = subprocess.run(["ip", "netns", "exec", self.ns, "ss", "-Hltn"], capture_output=True, text=True,
                             check=True).stdout
        return {line.split()[3] for line in out.splitlines() if line.strip()}

    def cut(self) -> None:
        """Pull the cable: the host's only link goes down, its processes stay up."""
        _ip("-n", self.ns, "link", "set", "eth0", "down")

    def reconnect(self) -> None:
        _ip("-n", self.ns, "link", "set", "eth0", "up")


@dataclass
class Network:
    tag: str = field(default_factory=lambda: uuid.uuid4().hex[:5])
    hosts: dict[str, Host] = field(default_factory=dict)
    _next: int = 1

    @property
    def switch(self) -> str:
        return f"y2{self.tag}-sw"

    @property
    def client_link(self) -> str:
        return f"y2{self.tag}c"

    def create(self) -> Network:
        _ip("netns", "add", self.switch)
        _ip("-n", self.switch, "link", "add", "br0", "type", "bridge")
        _ip("-n", self.switch, "link", "set", "br0", "up")
        _ip("link", "add", self.client_link, "type", "veth", "peer", "name", "client", "netns", self.switch)
        self._plug("client")
        _ip("addr", "add", f"{CLIENT_ADDR}/24", "dev", self.client_link)
        _ip("link", "set", self.client_link, "up")
        return self

    def _plug(self, port: str) -> None:
        _ip("-n", self.switch, "link", "set", port, "master", "br0")
        _ip("-n", self.switch, "link", "set", port, "up")

    def add(self, name: str, *, own_pids: bool = False) -> Host:
        """A new host on the switch, with the next address of the subnet."""
        ns, addr, port = f"y2{self.tag}-{name}", f"{SUBNET}.{self._next}", f"p{self._next}"
        self._next += 1
        _ip("netns", "add", ns)
        _ip("-n", self.switch, "link", "add", port, "type", "veth", "peer", "name", "eth0", "netns", ns)
        self._plug(port)
        _ip("-n", ns, "addr", "add", f"{addr}/24", "dev", "eth0")
        _ip("-n", ns, "link", "set", "eth0", "up")
        _ip("-n", ns, "link", "set", "lo", "up")
        host = Host(ns=ns, name=name, addr=addr, own_pids=own_pids)
        self.hosts[name] = host
        return host

    def destroy(self) -> None:
        """Kill every process of every host, then delete the namespaces (and with them the links)."""
        for host in self.hosts.values():
            host.kill_all()
        for ns in [h.ns for h in self.hosts.values()] + [self.switch]:
            subprocess.run(["ip", "netns", "del", ns], capture_output=True)
        subprocess.run(["ip", "link", "del", self.client_link], capture_output=True)
