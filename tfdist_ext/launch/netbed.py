"""A slow-network test bed: one network namespace per worker, a shaped link each.

    root namespace                     namespace tfdist-<job>-<i>
    +-----------------------+          +-------------------------------+
    | bridge tfd<job>       |--veth----| tfd<job>n<i>  10.213.B.(i+1)/24 |
    |   port tfd<job>r<i>   |  pair    |   lo up                       |
    +-----------------------+          +-------------------------------+

Shaping: an HTB class of the requested rate on BOTH ends of every veth, i.e.
each worker's egress (namespace side: what it sends) and ingress (bridge side:
what it receives) is capped at the rate, like a full-duplex switch port of
that speed. Two workers talking therefore see the rate in each direction.

Delay (`latency`, one way between any two hosts, or per pair of hosts): this
kernel has no `netem` qdisc, so each namespace queues what arrives on its link
(iptables NFQUEUE on PREROUTING, the receiver's side; by sender address when the
delays differ) to delay lines, `delayer.py`, that release every packet `latency`
seconds after it arrived. Handshakes, data and ACKs are all delayed, so TCP sees
the round-trip time 2 x latency as on a long link, and the bandwidth shaping
still applies. A delay line that dies is reported by `problem()`.

Everything created is named after a short random job id, and a marker file
/run/tfdist_netbed/<job> holds the launcher's pid (and its start time). A run
that was killed before tearing down leaves a marker whose pid is gone; the
next `setup()` removes what it left and says so in one line (`netjobs`).
"""

import ipaddress
import os
import random
import shutil
import signal
import subprocess
import sys
from typing import List, Optional, Tuple

from tfdist_ext.launch import linkspec
from tfdist_ext.launch.netjobs import (NetBedError, clean_leftovers, create_marker, remove_job,
                                       run, subnets_in_use)

SUBNET_PREFIX = "10.213"  # 10.213.B.0/24, B chosen per job among unused ones.
_PACKAGE_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
NO_NETBED = "leave out --link-bandwidth: the plain launcher works without it"
NO_LATENCY = "leave out --link-latency: bandwidth shaping works without it"

def check_available(latency: bool = False):
    """Raises NetBedError unless we are root and the tools are installed: `ip` and `tc`,
    and with `latency` also `iptables` and the `fnfqueue` package."""
    option = "--link-latency" if latency else "--link-bandwidth"
    if os.geteuid() != 0:
        raise NetBedError(
            f"{option} needs root (network namespaces and tc); running as uid "
            f"{os.geteuid()}. Run as root, or {NO_NETBED if not latency else NO_LATENCY}.")
    missing = [tool for tool in ("ip", "tc") if shutil.which(tool) is None]
    if missing:
        raise NetBedError(
            f"{option} needs `ip` and `tc` (iproute2); not found on PATH: "
            f"{', '.join(missing)}. Install iproute2 (apt-get install -y iproute2), or "
            f"{NO_NETBED}.")
    if not latency:
        return
    if shutil.which("iptables") is None:
        raise NetBedError(
            f"--link-latency needs `iptables` (its NFQUEUE target hands packets to the "
            f"delay line); not found on PATH. Install it (apt-get install -y iptables), "
            f"or {NO_LATENCY}.")
    try:
        import fnfqueue  # noqa: F401  pylint: disable=import-outside-toplevel,unused-import
    except ImportError as err:
        raise NetBedError(
            f"--link-latency needs the Python package fnfqueue (netfilter queue): {err}. "
            f"Install it (pip install 'fnfqueue>=1.1.2,<1.2'), or {NO_LATENCY}.") from None


def child_env() -> dict:
    """The environment for the bed's own Python helpers (delay lines, link checks):
    this one, with tfdist_ext importable even when it is not installed."""
    return dict(os.environ, PYTHONPATH=os.pathsep.join(
        p for p in (_PACKAGE_ROOT, os.environ.get("PYTHONPATH")) if p))


class NetBed:
    """N namespaces on one bridge, each link shaped to `rate` and delayed by `latency`.

    Args:
        num_workers: Namespaces to create (one per worker).
        rate: A tc rate, e.g. '50mbit' (validated by `linkspec.parse_rate`), or None for
            links as fast as the machine.
        log: Callable taking one line, for what the bed does (e.g. cleaning).
        latency: One-way delay in seconds between any two namespaces (each packet
            is held that long on arriving at its receiver's namespace), a dict
            ``{(host_a, host_b): seconds}`` of delays per pair of hosts (both
            directions; pairs not listed are not delayed), or None.
            Long delays need large TCP buffers to fill the link: the namespaces get
            `tcp_rmem`/`tcp_wmem` maxima of 4 x the bandwidth-delay product (at
            least the kernel's defaults).
        num_hosts: Namespaces ("hosts") the workers are spread over, in order:
            worker i lives in host ``i // (num_workers // num_hosts)`` and shares
            its address; workers of one host talk over its loopback, unshaped and
            undelayed, and only traffic between hosts crosses the shaped links.
            Defaults to one host per worker.
        num_servers: Parameter servers, each on a host of its own after the
            workers' hosts (host ``num_hosts + j`` for server j; `latency` pairs
            may name them), its links shaped and delayed like a worker host's.

    Use `with NetBed(...) as bed:` or `setup()` / `teardown()`; `bed.addresses[i]`
    is worker i's IPv4 address and `bed.wrap(i, argv)` runs argv inside its namespace;
    `bed.server_addresses[j]` and `bed.wrap(j, argv, server=True)` for server j.
    """

    def __init__(self, num_workers: int, rate: Optional[str], log=None,
                 latency: Optional[float] = None, num_hosts: Optional[int] = None,
                 num_servers: int = 0):
        num_hosts = num_workers if num_hosts is None else num_hosts
        if not 1 <= num_hosts <= 253 or not 0 <= num_servers <= 253 - num_hosts:
            raise ValueError(f"NetBed: `num_hosts` + `num_servers` must be 1..253 (one /24, "
                             f"at least one worker host); received {num_hosts} + "
                             f"{num_servers}")
        if num_workers < 1 or num_workers % num_hosts:
            raise ValueError(f"NetBed: `num_workers` must be a positive multiple of "
                             f"`num_hosts` ({num_hosts}); received {num_workers}")
        pairs = latency if isinstance(latency, dict) else {}
        total = num_hosts + num_servers
        for (a, b), seconds in pairs.items():
            if not (0 <= a < total and 0 <= b < total and a != b):
                raise ValueError(f"NetBed: `latency` names the host pair {a}:{b}, but the "
                                 f"hosts are 0..{total - 1}; use two different ones")
        for seconds in ([latency] if latency is not None and not pairs else pairs.values()):
            if not 0 <= seconds <= 10:
                raise ValueError(f"NetBed: `latency` must be 0..10 seconds; received "
                                 f"{seconds}")
        self.rate_bps = linkspec.parse_rate(rate) if rate is not None else None
        self.rate = rate.strip().lower() if rate is not None else None
        self.latency = latency
        self.num_workers = num_workers
        self.num_hosts = num_hosts
        self.num_servers = num_servers
        self.per_host = num_workers // num_hosts
        self.log = log or (lambda line: None)
        self._host_addresses: List[str] = []  # one per namespace, set by `setup`
        self._created = False
        self._delayers: List[Tuple[int, subprocess.Popen]] = []  # (host, process)
        self._name("%05x" % random.getrandbits(20))

    def _name(self, job: str):
        self.job = job  # 5 hex digits: `tfd<job>r<i>` fits the 15-character limit.
        self.bridge = f"tfd{job}"
        self.namespaces = [f"tfdist-{job}-{h}"
                           for h in range(self.num_hosts + self.num_servers)]

    @property
    def addresses(self) -> List[str]:
        """Each worker's IPv4 address (its host's), once set up."""
        if len(self._host_addresses) < len(self.namespaces):
            return []
        return [self._host_addresses[self.host_of(w)] for w in range(self.num_workers)]

    @property
    def server_addresses(self) -> List[str]:
        """Each parameter server's IPv4 address, once set up."""
        return self._host_addresses[self.num_hosts:]

    def wrap(self, index: int, argv, server: bool = False) -> List[str]:
        """`argv` run inside worker (or server) `index`'s namespace (`ip` execs it: same pid)."""
        host = self.num_hosts + index if server else self.host_of(index)
        return ["ip", "netns", "exec", self.namespaces[host], *argv]

    def _shape(self, device: str, netns: Optional[str] = None):
        tc = ["tc", "-n", netns] if netns else ["tc"]
        # A burst of a few ms of traffic (>= 64 KB for GSO packets) keeps HTB accurate.
        burst = str(max(64 * 1024, int(self.rate_bps / 8 * 0.002)))
        run(*tc, "qdisc", "replace", "dev", device, "root", "handle", "1:", "htb",
             "default", "1")
        run(*tc, "class", "add", "dev", device, "parent", "1:", "classid", "1:1", "htb",
             "rate", self.rate, "ceil", self.rate, "burst", burst, "cburst", burst,
             "quantum", "60000")

    def setup(self) -> "NetBed":
        check_available(latency=self.latency is not None)
        clean_leftovers(self.log)
        while not create_marker(self.job):  # id taken: draw again
            self._name("%05x" % random.getrandbits(20))
        self._created, self._host_addresses = True, []
        try:
            used = subnets_in_use()
            free = [b for b in range(256) if not any(
                ipaddress.ip_network(f"{SUBNET_PREFIX}.{b}.0/24").overlaps(n) for n in used)]
            if not free:
                raise NetBedError(f"no free /24 left in {SUBNET_PREFIX}.0.0/16")
            subnet = f"{SUBNET_PREFIX}.{random.choice(free)}"
            run("ip", "link", "add", self.bridge, "type", "bridge")
            run("ip", "link", "set", self.bridge, "up")
            for i, netns in enumerate(self.namespaces):  # one per host
                outer, inner = f"tfd{self.job}r{i}", f"tfd{self.job}n{i}"
                run("ip", "netns", "add", netns)
                run("ip", "link", "add", outer, "type", "veth", "peer", "name", inner,
                     "netns", netns)
                run("ip", "link", "set", outer, "master", self.bridge, "up")
                run("ip", "-n", netns, "link", "set", "lo", "up")
                run("ip", "-n", netns, "addr", "add", f"{subnet}.{i + 1}/24", "dev", inner)
                run("ip", "-n", netns, "link", "set", inner, "up")
                if self.rate is not None:
                    self._shape(inner, netns)
                    self._shape(outer)
                self._host_addresses.append(f"{subnet}.{i + 1}")
            if self.latency is not None:
                for host in range(len(self.namespaces)):
                    self._delay(host, f"tfd{self.job}n{host}")
        except BaseException:
            self.teardown()
            raise
        layout = (f"{self.num_workers} namespaces" if self.per_host == 1 else
                  f"{self.num_hosts} hosts (namespaces) of {self.per_host} workers")
        if self.num_servers:
            layout += f" and {self.num_servers} for parameter servers"
        self.log(f"network test bed {self.job}: {layout} on {subnet}.0/24, "
                 f"{self.describe()}.")
        return self

    def describe(self) -> str:
        """What the links emulate, in words."""
        parts = [f"every link shaped to {self.rate} each way (tc HTB)"] if self.rate else []
        between = "workers" if self.per_host == 1 and not self.num_servers else "hosts"
        if isinstance(self.latency, dict):
            parts.append(f"one way between {between} " + ", ".join(
                f"{a}:{b} {d * 1e3:g} ms" for (a, b), d in sorted(self.latency.items()))
                + " (round trips twice that; NFQUEUE delay lines)")
        elif self.latency is not None:
            parts.append(f"{self.latency * 1e3:g} ms one way between {between} (round trip "
                         f"{2 * self.latency * 1e3:g} ms; NFQUEUE delay line)")
        return ", ".join(parts) or "links unshaped"

    def host_of(self, worker: int) -> int:
        """The host (namespace index) worker `worker` runs in."""
        return worker // self.per_host

    def delay_between(self, host_a: int, host_b: int) -> float:
        """Seconds each packet from `host_a` to `host_b` is held (0 inside a host)."""
        if host_a == host_b or self.latency is None:
            return 0.0
        if isinstance(self.latency, dict):
            return self.latency.get(tuple(sorted((host_a, host_b))), 0.0)
        return self.latency

    def _delay(self, host: int, device: str):
        """Starts host `host`'s delay lines (one per distinct delay towards it), then
        queues what arrives on `device` to them (by sender address when delays differ)."""
        netns = self.namespaces[host]
        by_delay = {}
        for other in range(len(self.namespaces)):
            delay = self.delay_between(other, host)
            if other != host and delay > 0:
                by_delay.setdefault(delay, []).append(other)
        if not by_delay:
            return
        if self.rate_bps:
            # Enough buffer for the window to cover 2 x the round trip at full rate.
            need = int(4 * self.rate_bps / 8 * 2 * max(by_delay))
            for knob, default in (("tcp_rmem", 6291456), ("tcp_wmem", 4194304)):
                current = run("ip", "netns", "exec", netns, "sysctl", "-n",
                               f"net.ipv4.{knob}").split()
                run("ip", "netns", "exec", netns, "sysctl", "-q", "-w",
                     f"net.ipv4.{knob}={current[0]} {current[1]} {max(need, default)}")
        uniform = not isinstance(self.latency, dict)
        for queue, (delay, sources) in enumerate(sorted(by_delay.items())):
            line = [sys.executable, "-m", "tfdist_ext.launch.delayer", "--queue", str(queue),
                    "--delay", repr(delay)]
            delayer = subprocess.Popen(
                ["ip", "netns", "exec", netns, *line],
                stdout=subprocess.PIPE, stdin=subprocess.DEVNULL, text=True, env=child_env())
            self._delayers.append((host, delayer))
            if delayer.stdout.readline().strip() != "ready":
                raise NetBedError(f"the delay line of {self._host_name(host)} failed to "
                                  f"start (exit {delayer.wait()}); its error is above")
            # No rule before the line is bound: NFQUEUE drops packets nobody reads.
            matches = [[]] if uniform else [
                ["-s", self._host_addresses[other]] for other in sources]
            for match in matches:
                run("ip", "netns", "exec", netns, "iptables", "-t", "mangle", "-A",
                     "PREROUTING", "-i", device, *match, "-j", "NFQUEUE", "--queue-num",
                     str(queue))

    def problem(self) -> Optional[str]:
        """Why the links no longer emulate what was asked (a delay line died), or None."""
        for host, delayer in self._delayers:
            code = delayer.poll()
            if code is not None:
                name = self._host_name(host)
                return (f"the delay line of {name} (pid {delayer.pid}) exited "
                        f"with code {code}: packets to {name} are dropped")
        return None

    def _host_name(self, host: int) -> str:
        if host >= self.num_hosts:
            return f"parameter server {host - self.num_hosts}"
        if self.per_host == 1:
            return f"worker {host}"
        workers = range(host * self.per_host, (host + 1) * self.per_host)
        return f"host {host} (workers {', '.join(map(str, workers))})"

    def teardown(self):
        """Removes everything `setup` created; safe to call twice or after a failed setup."""
        if not self._created:
            return
        # A Ctrl-C now would leave half a bed behind: hold SIGINT/SIGTERM until done.
        old = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT, signal.SIGTERM})
        try:
            for _, delayer in self._delayers:  # SIGTERM: each prints what it carried
                if delayer.poll() is None:
                    delayer.terminate()
            for _, delayer in self._delayers:
                try:
                    delayer.wait(timeout=2)
                except subprocess.TimeoutExpired:
                    pass
            remove_job(self.job)  # kills what is left with the namespaces
            for _, delayer in self._delayers:
                delayer.wait()
            self._delayers = []
            self._created = False
        finally:
            signal.pthread_sigmask(signal.SIG_SETMASK, old)

    def __enter__(self):
        return self.setup()

    def __exit__(self, *exc):
        self.teardown()
