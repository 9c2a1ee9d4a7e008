"""Addresses and TF_CONFIGs for workers started on this machine (`tfdist-run`, tests)."""

import json
import random
import socket
from typing import List, Sequence


def free_ports(count: int, host: str = "127.0.0.1") -> List[int]:
    """`count` distinct ports that were free a moment ago on `host`.

    The ports are drawn below the kernel's ephemeral range
    (/proc/sys/net/ipv4/ip_local_port_range) where there is room: the kernel
    gives outgoing connections (gRPC, UCX) ports from that range, so one
    opened between this call and a worker's bind cannot take a chosen port.
    """
    low = _ephemeral_low()
    pool = list(range(max(1024, low - 16384), low))
    random.SystemRandom().shuffle(pool)
    sockets: List[socket.socket] = []
    try:
        for port in pool:
            if len(sockets) == count:
                break
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            try:
                sock.bind((host, port))
            except OSError:
                sock.close()
                continue
            sockets.append(sock)
        while len(sockets) < count:  # no room below the ephemeral range
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            sock.bind((host, 0))
            sockets.append(sock)
        return [s.getsockname()[1] for s in sockets]
    finally:
        for sock in sockets:
            sock.close()


def _ephemeral_low() -> int:
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range", encoding="ascii") as f:
            return int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def tf_configs(addresses: Sequence[str], servers: Sequence[str] = ()) -> List[str]:
    """One TF_CONFIG JSON string per worker of `addresses`, then one per "ps" task of `servers`."""
    cluster = {"worker": list(addresses)}
    if servers:
        cluster["ps"] = list(servers)
    return ([json.dumps({"cluster": cluster, "task": {"type": "worker", "index": i}})
             for i in range(len(addresses))]
            + [json.dumps({"cluster": cluster, "task": {"type": "ps", "index": i}})
               for i in range(len(servers))])
