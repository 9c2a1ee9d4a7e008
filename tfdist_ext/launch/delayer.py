"""A delay line for the test bed: holds each queued packet for a fixed time, then accepts it.

    ip netns exec NS python -m tfdist_ext.launch.delayer --queue 0 --delay 0.05

The kernel hands every packet matched by an `iptables ... -j NFQUEUE --queue-num Q`
rule to this process (netfilter queue, through `fnfqueue`); it is released with an
ACCEPT verdict `delay` seconds after it arrived, in arrival order. Only packet
metadata crosses to user space (COPY_META) and GSO packets are not split, so a few
thousand verdicts per second carry a 100 Mbit/s link.

Rules are placed on the receiving side (the namespace's PREROUTING, matching its
link): queuing at the sender's OUTPUT would count the held packets against TCP Small
Queues and starve the flow. A packet that finds the kernel queue full (`maxlen`) is
dropped, as a router's full buffer would.

The process prints `ready` once bound, and exits on SIGTERM/SIGINT after releasing
what it holds. It sleeps on the socket and on a condition variable, never polling.
"""

import argparse
import collections
import os
import signal
import socket
import sys
import threading
import time


class DelayLine:
    """Releases packets `delay` seconds after `hold` was called for them, in order.

    Args:
        delay: Seconds to hold every packet (>= 0).
        release: Called with a packet when its time has come (from the release thread).
    """

    def __init__(self, delay: float, release):
        if delay < 0:
            raise ValueError(f"DelayLine: `delay` must be >= 0 seconds; received {delay}")
        self.delay = delay
        self._release = release
        self._held = collections.deque()
        self._wake = threading.Condition()
        self._closing = False
        self._thread = threading.Thread(target=self._run, name="delay-line", daemon=True)
        self._thread.start()

    def hold(self, packet):
        due = time.monotonic() + self.delay
        with self._wake:
            self._held.append((due, packet))
            if len(self._held) == 1:
                self._wake.notify()

    def _run(self):
        while True:
            with self._wake:
                while not self._held and not self._closing:
                    self._wake.wait()
                if not self._held:
                    return
                due, packet = self._held[0]
                wait = due - time.monotonic()
                if wait > 0 and not self._closing:
                    self._wake.wait(wait)
                    continue
                self._held.popleft()
            try:
                self._release(packet)
            except Exception as err:  # pylint: disable=broad-except
                # A line that stops releasing would black-hole the link; end the
                # process instead, so the launcher sees it (NetBed.problem).
                print(f"delay line: releasing a packet failed: {err!r}", file=sys.stderr,
                      flush=True)
                os._exit(3)

    def close(self):
        """Releases everything still held at once and stops the thread."""
        with self._wake:
            self._closing = True
            self._wake.notify()
        self._thread.join()


def serve(queue: int, delay: float, maxlen: int = 65536) -> int:
    import fnfqueue  # pylint: disable=import-outside-toplevel

    try:  # the link, not the training, should wait when the two cores are busy
        os.setpriority(os.PRIO_PROCESS, 0, -10)
    except OSError:
        pass
    conn = fnfqueue.Connection(packet_size=4096)
    # A deep socket buffer, so bursts wait in the kernel instead of being dropped
    # while this process is descheduled (root may exceed rmem_max).
    with socket.socket(socket.AF_NETLINK, socket.SOCK_RAW,
                       fileno=os.dup(conn._conn.fd)) as sock:  # pylint: disable=protected-access
        sock.setsockopt(socket.SOL_SOCKET, getattr(socket, "SO_RCVBUFFORCE", 33), 32 << 20)
    bound = conn.bind(queue)
    bound.set_mode(fnfqueue.MAX_PAYLOAD, fnfqueue.COPY_META)
    bound.set_maxlen(maxlen)
    bound.gso = True
    line = DelayLine(delay, lambda packet: packet.accept())

    def stop(_signum, _frame):
        conn.close()  # ends the iteration below

    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, stop)
    print("ready", flush=True)
    held = overflows = 0
    try:
        while True:
            try:
                for packet in conn:
                    line.hold(packet)
                    held += 1
                return 0
            except fnfqueue.BufferOverflowException:
                # The kernel dropped packets it could not hand over, as a full router
                # buffer would; carry on.
                overflows += 1
                conn.reset()
    finally:
        line.close()
        print(f"delay line (queue {queue}, {delay * 1e3:g} ms): {held} packets held, "
              f"{overflows} socket overflows", file=sys.stderr, flush=True)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tfdist_ext.launch.delayer",
                                     description=__doc__.split("\n")[0])
    parser.add_argument("--queue", type=int, required=True, help="netfilter queue number")
    parser.add_argument("--delay", type=float, required=True, help="seconds to hold")
    parser.add_argument("--maxlen", type=int, default=65536,
                        help="packets the kernel may hold for this queue (default 65536)")
    args = parser.parse_args(argv)
    return serve(args.queue, args.delay, args.maxlen)


if __name__ == "__main__":
    sys.exit(main())
