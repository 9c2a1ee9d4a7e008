"""Measures the TCP throughput a `NetBed` link achieves, next to the rate requested.

    python -m tfdist_ext.launch.netcheck --link-bandwidth 50mbit   # builds its own bed
    tfdist-run -np 2 --link-bandwidth 50mbit --check [-- cmd ...]  # same, then runs cmd

A receiver in worker 1's namespace accepts one connection and times the bytes
from the first to the last; a sender in worker 0's namespace writes them. The
amount is about 1.5 s of traffic at the requested rate (5 MB to 256 MB).
"""

import argparse
import dataclasses
import json
import os
import socket
import subprocess
import sys
import time

_CHUNK = 64 * 1024


@dataclasses.dataclass
class Throughput:
    requested_bps: float
    nbytes: int
    seconds: float

    @property
    def mbit_s(self) -> float:
        return self.nbytes * 8 / self.seconds / 1e6

    def __str__(self):
        percent = self.mbit_s * 1e8 / self.requested_bps
        return (f"measured {self.nbytes / self.seconds / 1e6:.2f} MB/s = {self.mbit_s:.1f} "
                f"Mbit/s over {self.nbytes / 1e6:.1f} MB (requested "
                f"{self.requested_bps / 1e6:g} Mbit/s, {percent:.0f}%)")


def _receive(host, port):
    server = socket.create_server((host, port))
    print("ready", flush=True)
    conn, _ = server.accept()
    nbytes, first = 0, None
    while True:
        data = conn.recv(1 << 20)
        if not data:
            break
        first = first or time.perf_counter()
        nbytes += len(data)
    print(json.dumps({"bytes": nbytes, "seconds": time.perf_counter() - (first or 0)}),
          flush=True)


def _send(host, port, nbytes):
    block = os.urandom(_CHUNK)
    with socket.create_connection((host, port), timeout=60) as conn:
        while nbytes > 0:
            conn.sendall(block[:min(nbytes, _CHUNK)])
            nbytes -= _CHUNK


def measure(bed, sender=0, receiver=1, nbytes=None, port=5201) -> Throughput:
    """TCP throughput from worker `sender`'s namespace to worker `receiver`'s."""
    if nbytes is None:
        nbytes = int(min(256e6, max(5e6, bed.rate_bps / 8 * 1.5)))
    me = [sys.executable, "-m", "tfdist_ext.launch.netcheck"]
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        p for p in (root, os.environ.get("PYTHONPATH")) if p))
    host = bed.addresses[receiver]
    procs = []
    try:
        recv = subprocess.Popen(bed.wrap(receiver, [*me, "--serve", host, str(port)]),
                                stdout=subprocess.PIPE, text=True, env=env)
        procs.append(recv)
        if recv.stdout.readline().strip() != "ready":
            raise RuntimeError(f"throughput receiver failed to start (exit {recv.wait()})")
        send = subprocess.Popen(
            bed.wrap(sender, [*me, "--send", host, str(port), str(nbytes)]), env=env)
        procs.append(send)
        out, _ = recv.communicate(timeout=120)
        if send.wait(timeout=30) != 0 or recv.returncode != 0:
            raise RuntimeError("throughput check failed (see the messages above)")
        result = json.loads(out)
        return Throughput(bed.rate_bps, result["bytes"], result["seconds"])
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
    from tfdist_ext.launch import netbed  # pylint: disable=import-outside-toplevel
    try:
        netbed.parse_rate(args.link_bandwidth)
        with netbed.NetBed(2, args.link_bandwidth,
                           log=lambda line: print(f"netcheck: {line}")) as bed:
            print(f"netcheck: {measure(bed, nbytes=args.bytes)}")
    except ValueError as err:
        parser.error(f"argument --link-bandwidth: {err}")
    except netbed.NetBedError as err:
        print(f"netcheck: {err}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
