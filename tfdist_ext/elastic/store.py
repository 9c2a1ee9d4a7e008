"""A key-value store each worker serves, for meetings that must outlive worker 0.

TF's coordination service, whose store `tfdist_ext.coordination` uses, runs in
worker 0's process and dies with it. In elastic training every worker also
serves this small store (Python's standard XML-RPC server, on a thread, on
its TF_CONFIG host and a free port); the survivors of a failure meet in the
store of the first survivor in the members' order. Like TF's own gRPC server it is
unauthenticated: run jobs on networks you trust.

Keys are set once; `get` waits until the key exists or the timeout passes.
"""

import socket
import socketserver
import threading
import time
import xmlrpc.client
import xmlrpc.server
from typing import Optional


_DAY_SECONDS = 86400.0


_MARGIN_SECONDS = 30.0  # a call's socket timeout beyond the wait it asks for


class _Server(socketserver.ThreadingMixIn, xmlrpc.server.SimpleXMLRPCServer):
    daemon_threads = True


class _Server6(_Server):
    address_family = socket.AF_INET6


class Store:
    """The store this worker serves (from a daemon thread, until the process exits).

    Args:
        host: The host the others reach this worker at (its TF_CONFIG host);
            the store listens on every interface of that address family.
    """

    def __init__(self, host: str):
        self._values = {}
        self._changed = threading.Condition()
        host = host.strip("[]")
        ipv6 = ":" in host
        server = _Server6 if ipv6 else _Server
        self._server = server(("::" if ipv6 else "0.0.0.0", 0), logRequests=False,
                              allow_none=True)
        self._server.register_function(self._set, "set")
        self._server.register_function(self._get, "get")
        port = self._server.server_address[1]
        self.address = f"[{host}]:{port}" if ipv6 else f"{host}:{port}"
        threading.Thread(target=self._server.serve_forever, name="tfdist-elastic-store",
                         daemon=True).start()

    def _set(self, key, value):
        with self._changed:
            if key in self._values:
                return False
            self._values[key] = value
            self._changed.notify_all()
            return True

    def _get(self, key, seconds):
        with self._changed:
            self._changed.wait_for(lambda: key in self._values, max(float(seconds), 0.0))
            return self._values.get(key)

    def wait(self, key: str, seconds: float):
        """The value of `key` in this store, waiting up to `seconds`; None if absent."""
        return self._get(key, seconds)

    def items(self, prefix: str, more_than: int = -1, seconds: float = 0.0) -> dict:
        """The keys set so far that start with `prefix`, with their values (this
        process's store only); first waits up to `seconds` until there are more
        than `more_than` of them."""
        def matching():
            return {k: v for k, v in self._values.items() if k.startswith(prefix)}

        with self._changed:
            self._changed.wait_for(lambda: len(matching()) > more_than, max(seconds, 0.0))
            return matching()

    def close(self):
        self._server.shutdown()
        self._server.server_close()


class Client:
    """`set` / `get` on the store at `address` ("host:port"); each call its own connection.

    The same two methods as `tfdist_ext.coordination.KeyValue`.

    Args:
        address: The store's "host:port".
        check: Called every `check_seconds` while `get` waits; it raises to end
            the wait (the members give up a meeting with a worker that died).
        check_seconds: How often `check` runs. Each check costs one more call.
    """

    def __init__(self, address: str, check=None, check_seconds: float = 1.0):
        self.address = address
        self._check, self._check_seconds = check, check_seconds

    def _proxy(self, seconds, margin=_MARGIN_SECONDS):
        return xmlrpc.client.ServerProxy(f"http://{self.address}", allow_none=True,
                                         transport=_Transport(seconds + margin))

    def set(self, key: str, value: str):
        """Stores `value` under `key` (raises KeyError if the key was set before)."""
        if not self._proxy(0).set(key, str(value)):
            raise KeyError(f"{key!r} is already set in the store at {self.address}")

    def get(self, key: str, seconds=None) -> str:
        """The value of `key`, waiting up to `seconds` (None: a day); raises
        TimeoutError if absent then, or what `check` raises."""
        seconds = _DAY_SECONDS if seconds is None else seconds
        deadline = time.monotonic() + seconds
        while True:
            left = max(deadline - time.monotonic(), 0.0)
            wait = left if self._check is None else min(left, self._check_seconds)
            value = self._proxy(wait).get(key, float(wait))
            if value is not None:
                return value
            if wait >= left:
                raise TimeoutError(f"{key!r} was not set in the store at {self.address} "
                                   f"within {seconds:g} s")
            self._check()

    def answers(self, seconds: float) -> bool:
        """Whether the store's process answers a call within `seconds`."""
        return self.reach(seconds) is True

    def reach(self, seconds: float) -> Optional[bool]:
        """True: the store's process answered a call within `seconds`; False: it cannot
        (the connection was refused or broken: no process serves the address); None:
        no answer in time (a process that is stopped, hung or starved of CPU, or a
        network that drops packets)."""
        try:
            self._proxy(seconds, margin=0.0).get("", 0.0)
            return True
        except TimeoutError:
            return None
        except (OSError, xmlrpc.client.Error):
            return False


class _Transport(xmlrpc.client.Transport):
    """HTTP with a socket timeout: a store whose process is stopped or whose host
    hangs fails the call instead of blocking it."""

    def __init__(self, seconds):
        super().__init__()
        self._seconds = seconds

    def make_connection(self, host):
        connection = super().make_connection(host)
        connection.timeout = self._seconds
        return connection
