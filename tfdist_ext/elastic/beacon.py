"""How a replacement for worker 0 finds the running job (elastic training).

A replacement for another worker finds the members through TF's coordination
service, which runs in worker 0's process; a replacement for worker 0 cannot,
because that service died with the worker. Each member therefore answers on
UDP at its own TF_CONFIG port (TF's gRPC server holds the TCP port of the same
number, UDP's is free): a datagram `QUERY` gets the members' store addresses
and membership, per elastic strategy. Worker 0 asks its peers once at start-up
(`running_job`, under TFDIST_ELASTIC=1): an answer (`remember`) means the job runs without
it, and it joins as a replacement instead of starting TF's coordination
service. Standard library only: `early` calls it before TensorFlow starts.

Like TF's gRPC server it is unauthenticated: run jobs on networks you trust,
and let UDP through on the TF_CONFIG ports where a firewall filters them.
"""

import json
import logging
import socket
import threading
import time
from typing import Callable, Dict, Optional, Sequence

log = logging.getLogger("tfdist_ext")
QUERY = b"tfdist-elastic-stores?"
PROBE_TRIES = 3
PROBE_SECONDS = 0.5  # per try: a training process's answering thread needs the GIL

_lock = threading.Lock()
_answers: Dict[str, Callable[[], dict]] = {}  # strategy key prefix -> its state
_socket: Optional[socket.socket] = None
_found: Optional[dict] = None  # what `running_job` heard, for the strategies to come


def _split(address: str):
    host, _, port = address.rpartition(":")
    return host.strip("[]"), int(port)


def serve(address: str, prefix: str, state: Callable[[], dict]) -> bool:
    """Answers queries at `address`'s port with `state()` under `prefix`.

    Args:
        address: This worker's TF_CONFIG "host:port".
        prefix: The elastic strategy's key prefix (one process may run several).
        state: Returns a JSON-able dict: "stores" (worker index -> store
            address), "members" and "generation"; or None, not to answer (a
            replacement not yet admitted is not a member of the running job).

    Returns:
        Whether the port could be bound (False: logged; a replacement for
        worker 0 will not find this worker).
    """
    global _socket  # pylint: disable=global-statement
    with _lock:
        _answers[prefix] = state
        if _socket is not None:
            return True
        host, port = _split(address)
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        sock = socket.socket(family, socket.SOCK_DGRAM)
        try:
            sock.bind(("::" if family == socket.AF_INET6 else "0.0.0.0", port))
        except OSError as err:
            sock.close()
            log.warning("tfdist_ext: elastic training cannot answer on UDP port %d (%s): a "
                        "replacement for worker 0 will not find this worker.", port, err)
            return False
        _socket = sock
    threading.Thread(target=_answer, args=(sock,), name="tfdist-elastic-beacon",
                     daemon=True).start()
    return True


def _answer(sock):
    while True:
        try:
            data, sender = sock.recvfrom(256)
        except OSError:
            return
        if data != QUERY:
            continue
        with _lock:
            states = {prefix: state() for prefix, state in _answers.items()}
        states = {prefix: state for prefix, state in states.items() if state is not None}
        try:
            sock.sendto(json.dumps(states).encode(), sender)
        except OSError:
            continue


def running_job(peers: Sequence[str], tries: int = PROBE_TRIES,
                seconds: float = PROBE_SECONDS) -> Optional[dict]:
    """Asks the workers at `peers` ("host:port" each) whether a job runs.

    Returns:
        The first answer ({prefix: {"stores", "members", "generation"}}), or
        None when nobody answered within `tries` x `seconds` (a fresh start).
    """
    targets = []
    for peer in peers:
        host, port = _split(peer)
        try:
            info = socket.getaddrinfo(host, port, type=socket.SOCK_DGRAM)[0]
        except OSError:
            continue
        targets.append((info[0], info[4]))
    if not targets:
        return None
    socks = {family: socket.socket(family, socket.SOCK_DGRAM)
             for family in {family for family, _ in targets}}
    try:
        for _ in range(tries):
            for family, target in targets:
                try:
                    socks[family].sendto(QUERY, target)
                except OSError:
                    pass
            deadline = time.monotonic() + seconds
            while time.monotonic() < deadline:
                for sock in socks.values():
                    sock.settimeout(max(deadline - time.monotonic(), 0.001) / len(socks))
                    try:
                        data, _ = sock.recvfrom(65536)
                    except OSError:  # timeouts and ICMP errors alike
                        continue
                    try:
                        answer = json.loads(data)
                    except ValueError:
                        continue
                    if answer:
                        return answer
        return None
    finally:
        for sock in socks.values():
            sock.close()


def remember(answer: dict) -> None:
    """Keeps the running job's `answer` for this process's strategies (`found`)."""
    global _found  # pylint: disable=global-statement
    _found = answer


def found() -> Optional[dict]:
    """The running job this process joins (`remember`); None at a fresh start."""
    return _found
