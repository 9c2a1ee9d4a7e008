"""Measures the round trip and TCP throughput of a `NetBed` link, next to those requested.

    python -m tfdist_ext.launch.netcheck --link-bandwidth 50mbit [--link-latency 50ms]
    tfdist-run -np 2 --link-bandwidth 50mbit --check [-- cmd ...]  # same, then runs cmd

A receiver in worker 1's namespace accepts one connection. The sender in worker 0's
namespace first bounces one byte off it 10 times (TCP_NODELAY; the shortest is the
round trip, as ping's min: the delay line holds each packet at least the requested
time, and a busy machine only adds to it), then writes the bulk; the receiver times the
bytes from the first to the last (the mean, which includes TCP's slow start and any
loss recovery) and the best `_WINDOW` seconds (the rate the link lets through, as an
iperf interval; a long round trip or a busy machine lowers the mean, not the link).
The amount is about 1.5 s of traffic at the requested rate plus 20 round trips for
slow start (5 MB to 256 MB).
"""

import argparse
import dataclasses
import json
import os
import socket
import subprocess
import sys
import time
from typing import Optional

_CHUNK = 64 * 1024
_PINGS = 10
_WINDOW = 0.5


@dataclasses.dataclass
class LinkCheck:
    requested_bps: Optional[float]
    requested_rtt: Optional[float]
    nbytes: int
    seconds: float
    rtt: float
    best_mbit_s: Optional[float] = None

    @property
    def mbit_s(self) -> float:
        return self.nbytes * 8 / self.seconds / 1e6

    @property
    def peak_mbit_s(self) -> float:
        """The best `_WINDOW` seconds' rate, or the mean if the transfer was shorter."""
        return self.best_mbit_s if self.best_mbit_s is not None else self.mbit_s

    def __str__(self):
        rtt = f"round trip {self.rtt * 1e3:.2f} ms"
        if self.requested_rtt:
            rtt += (f" (requested {self.requested_rtt * 1e3:g} ms, "
                    f"{self.rtt * 100 / self.requested_rtt:.0f}%)")
        rate = (f"measured {self.nbytes / self.seconds / 1e6:.2f} MB/s = {self.mbit_s:.1f} "
                f"Mbit/s over {self.nbytes / 1e6:.1f} MB, best {_WINDOW:g} s "
                f"{self.peak_mbit_s:.1f} Mbit/s")
        if self.requested_bps is not None:
            rate += (f" (requested {self.requested_bps / 1e6:g} Mbit/s, mean "
                     f"{self.mbit_s * 1e8 / self.requested_bps:.0f}%, best "
                     f"{self.peak_mbit_s * 1e8 / self.requested_bps:.0f}%)")
        return f"{rate}; {rtt}"


def _receive(host, port):
    server = socket.create_server((host, port))
    print("ready", flush=True)
    conn, _ = server.accept()
    conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    for _ in range(_PINGS):
        conn.sendall(conn.recv(1))
    nbytes, first, marks = 0, None, []
    while True:
        data = conn.recv(1 << 20)
        if not data:
            break
        now = time.perf_counter()
        first = first or now
        nbytes += len(data)
        marks.append((now, nbytes))
    print(json.dumps({"bytes": nbytes, "seconds": time.perf_counter() - (first or 0),
                      "best_mbit_s": best_rate(marks, _WINDOW)}), flush=True)


def best_rate(marks, window):
    """The highest Mbit/s of a sliding window over `(time, cumulative bytes)` marks.

    Each mark ends the shortest span of at least `window` seconds that reaches back to
    an earlier mark; the result is the fastest of those spans, or None if every mark
    lies within `window` s of the first.
    """
    best, start = None, 0
    for end, (t_end, b_end) in enumerate(marks):
        while start + 1 < end and t_end - marks[start + 1][0] >= window:
            start += 1
        t_start, b_start = marks[start]
        if t_end - t_start >= window:
            rate = (b_end - b_start) * 8 / (t_end - t_start) / 1e6
            best = rate if best is None else max(best, rate)
    return best


def _send(host, port, nbytes):
    block = os.urandom(_CHUNK)
    with socket.create_connection((host, port), timeout=60) as conn:
        conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        rtts = []
        for _ in range(_PINGS):
            start = time.perf_counter()
            conn.sendall(b"x")
            conn.recv(1)
            rtts.append(time.perf_counter() - start)
        print(json.dumps({"rtt": min(rtts)}), flush=True)
        while nbytes > 0:
            conn.sendall(block[:min(nbytes, _CHUNK)])
            nbytes -= _CHUNK


def measure(bed, sender=0, receiver=1, nbytes=None, port=5201) -> LinkCheck:
    """Round trip and TCP throughput from worker `sender`'s namespace to `receiver`'s."""
    requested_rtt = (2 * bed.delay_between(bed.host_of(sender), bed.host_of(receiver))
                     if bed.latency is not None else None)
    if nbytes is None:
        seconds = 1.5 + 20 * (requested_rtt or 0)
        nbytes = int(min(256e6, max(5e6, (bed.rate_bps or 1e9) / 8 * seconds)))
    me = [sys.executable, "-m", "tfdist_ext.launch.netcheck"]
    from tfdist_ext.launch import netbed  # pylint: disable=import-outside-toplevel
    env = netbed.child_env()
    host = bed.addresses[receiver]
    procs = []
    try:
        recv = subprocess.Popen(bed.wrap(receiver, [*me, "--serve", host, str(port)]),
                                stdout=subprocess.PIPE, text=True, env=env)
        procs.append(recv)
        if recv.stdout.readline().strip() != "ready":
            raise RuntimeError(f"throughput receiver failed to start (exit {recv.wait()})")
        send = subprocess.Popen(
            bed.wrap(sender, [*me, "--send", host, str(port), str(nbytes)]), env=env,
            stdout=subprocess.PIPE, text=True)
        procs.append(send)
        out, _ = recv.communicate(timeout=120)
        sent, _ = send.communicate(timeout=30)
        if send.returncode != 0 or recv.returncode != 0:
            raise RuntimeError("link check failed (see the messages above)")
        result = json.loads(out)
        return LinkCheck(bed.rate_bps, requested_rtt, result["bytes"], result["seconds"],
                         json.loads(sent)["rtt"], result["best_mbit_s"])
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tfdist_ext.launch.netcheck",
                                     description=__doc__.split("\n")[0])
    parser.add_argument("--link-bandwidth", metavar="RATE", default="50mbit",
                        help="tc rate of each link (default 50mbit)")
    parser.add_argument("--link-latency", metavar="DELAY", default=None,
                        help="one-way delay between the two workers (e.g. 50ms)")
    parser.add_argument("--bytes", type=int, default=None, help="bytes to move")
    parser.add_argument("--serve", nargs=2, metavar=("HOST", "PORT"), help=argparse.SUPPRESS)
    parser.add_argument("--send", nargs=3, metavar=("HOST", "PORT", "N"),
                        help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.serve:
        _receive(args.serve[0], int(args.serve[1]))
        return 0
    if args.send:
        _send(args.send[0], int(args.send[1]), int(args.send[2]))
        return 0
    from tfdist_ext.launch import linkspec, netbed  # pylint: disable=import-outside-toplevel
    try:
        linkspec.parse_rate(args.link_bandwidth)
    except ValueError as err:
        parser.error(f"argument --link-bandwidth: {err}")
    try:
        latency = linkspec.parse_latency(args.link_latency) if args.link_latency else None
    except ValueError as err:
        parser.error(f"argument --link-latency: {err}")
    try:
        with netbed.NetBed(2, args.link_bandwidth, latency=latency,
                           log=lambda line: print(f"netcheck: {line}")) as bed:
            print(f"netcheck: {measure(bed, nbytes=args.bytes)}")
    except netbed.NetBedError as err:
        print(f"netcheck: {err}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
