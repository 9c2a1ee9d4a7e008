"""Engines side by side: tfdist_ext over UCX, TF's collectives, PyTorch's Gloo.

    python bench/engines.py --workers 2 --sizes 1KB,64KB,1MB,16MB,64MB --json out.json --png out.png
    python bench/engines.py --workers 2 --transport tcp ...   # UCX forced to TCP
    python bench/engines.py --replicas 4 --sizes 16MB         # logical CPUs, one process
    python bench/engines.py --workers 2 --hosts 2x1 --link-bandwidth 10gbit ...  # root

One job, the same worker processes, float32, every row timed the same way: a
call chains `--steps` all-reduces and starts right after a barrier; min and
median over `--repeat` calls. Rows:
    * ``ucx:<algorithm>``: the UCX engine (`engine="ucx"`) as a user gets it:
      worker processes of one machine sum through shared memory whatever the
      algorithm;
    * ``ucx-sched:<algorithm>``: the UCX engine running the algorithm's
      schedule over UCX (what it does across machines);
    * ``tf:native``: TF's own CollectiveReduceV2 ring (what stock
      MultiWorkerMirroredStrategy does), and ``tf:<algorithm>``: the graph engine;
    * ``gloo``: `torch.distributed.all_reduce` with the Gloo backend, when
      torch is installed (the `bench` extra), in the same processes.
With ``--hosts HxW`` the workers run on H emulated hosts (network namespaces
joined by veth pairs, `tfdist-run -H`), shaped to ``--link-bandwidth`` if
given: every engine then crosses the same links (UCX, TF's gRPC and Gloo all
use TCP between hosts), and one TCP stream from worker 0 to a worker of the
next host is timed in the job (median of 3): the link bound of a row is
2(p-1)/p x bytes / that stream's rate (``x_link`` = bound / time).
The machine's limits are measured in the same run: memcpy (numpy copy of the
largest size, best of 11, before and after the rows; the faster is the
limit, as the machine's speed drifts), memcpy by every worker at once (the
median per worker: no all-reduce of that size can beat it, since each rank
reads its input and writes its output) and one loopback TCP stream
(`--transport` decides whether UCX may use shared memory, ``UCX_TLS=tcp``
otherwise). algbw = bytes / time;
busbw = algbw * 2(p-1)/p as in nccl-tests. The chief's times are reported,
with each row's ratio to Gloo and to tf:native.
"""

import argparse
import os
import pathlib
import socket
import subprocess
import sys
import threading
import time

import numpy as np

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))

import harness  # noqa: E402  pylint: disable=wrong-import-position
from _relaunch import host_device  # noqa: E402  pylint: disable=wrong-import-position


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    where = parser.add_mutually_exclusive_group()
    where.add_argument("--workers", type=int, default=None)
    where.add_argument("--replicas", type=int, default=None)
    parser.add_argument("--sizes", default="1KB,64KB,1MB,16MB,64MB")
    parser.add_argument("--ucx", default="ring,butterfly",
                        help="UCX-engine algorithms (comma-separated)")
    parser.add_argument("--ucx-schedules", default="ring",
                        help="algorithms whose schedules run over UCX even on one machine")
    parser.add_argument("--tf", default="native",
                        help="TF-engine algorithms: 'native' and/or graph-engine names")
    parser.add_argument("--transport", choices=("any", "tcp"), default="any",
                        help="'tcp' sets UCX_TLS=tcp: the cross-host path on one machine")
    parser.add_argument("--hosts", default=None, metavar="HxW",
                        help="emulated hosts (tfdist-run -H HxW; needs root)")
    parser.add_argument("--link-bandwidth", default=None, metavar="RATE",
                        help="with --hosts: shape the links between hosts (10gbit, 1gbit)")
    parser.add_argument("--repeat", type=int, default=21)
    parser.add_argument("--steps", type=int, default=0,
                        help="all-reduces per timed call (0: 8 below 1 MB, else 2)")
    parser.add_argument("--no-gloo", action="store_true")
    harness.add_arguments(parser)
    return parser.parse_args(argv)


def relaunch(args, argv):
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    if args.transport == "tcp":
        env["UCX_TLS"] = "tcp"
    command = [sys.executable, "-m", "tfdist_ext.launch", "-np", str(args.workers)]
    if args.hosts:
        command += ["-H", args.hosts]
    if args.link_bandwidth:
        command += ["--link-bandwidth", args.link_bandwidth]
    command += [sys.executable, __file__, *argv]
    return subprocess.run(command, env=env, check=False).returncode


def memcpy_gbps(nbytes, repeats=11, stat=min):
    src, dst = np.ones(nbytes, np.uint8), np.empty(nbytes, np.uint8)
    np.copyto(dst, src)
    return nbytes / stat([_timed(lambda: np.copyto(dst, src)) for _ in range(repeats)]) / 1e9


def _drain(server, nbytes):
    """Accepts one connection on `server`, reads `nbytes`, answers one byte."""
    conn, _ = server.accept()
    view, left = bytearray(4 << 20), nbytes
    while left:
        left -= conn.recv_into(view, min(len(view), left))
    conn.sendall(b"x")
    conn.close()


def _stream_seconds(address, nbytes):
    """Seconds to send `nbytes` in 4 MB writes to `address` until the answer arrives."""
    data = b"\0" * (4 << 20)
    with socket.create_connection(address) as conn:
        start = time.perf_counter()
        for _ in range(nbytes // len(data)):
            conn.sendall(data)
        conn.recv(1)
        return time.perf_counter() - start


def loopback_tcp_gbps(nbytes=256 << 20):
    """One TCP stream over 127.0.0.1 between two threads (4 MB writes)."""
    server = socket.create_server(("127.0.0.1", 0))
    thread = threading.Thread(target=_drain, args=(server, nbytes))
    thread.start()
    seconds = _stream_seconds(("127.0.0.1", server.getsockname()[1]), nbytes)
    thread.join()
    server.close()
    return nbytes / seconds / 1e9


def link_stream_gbps(spec, rank, per_host, barrier, nbytes=64 << 20, repeats=3):
    """The median of `repeats` TCP streams of `nbytes` from worker 0 to worker
    `per_host` (the next host), timed by worker 0; None on the other workers."""
    rates = [_link_stream(spec, rank, per_host, barrier, nbytes) for _ in range(repeats)]
    return float(np.median(rates)) if rank == 0 else None


def _link_stream(spec, rank, per_host, barrier, nbytes):
    receiver = spec.jobs["worker"][per_host].rsplit(":", 1)
    address = (receiver[0], int(receiver[1]) + 2)
    server = socket.create_server(address) if rank == per_host else None
    barrier()
    seconds = None
    if server is not None:
        _drain(server, nbytes)
        server.close()
    elif rank == 0:
        seconds = _stream_seconds(address, nbytes)
    barrier()
    return nbytes / seconds / 1e9 if seconds else None


def _timed(fn):
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def gloo_times(sizes, steps_for, repeats, rank, world, address):
    """Seconds per all-reduce for each size with torch.distributed's Gloo backend."""
    import torch  # pylint: disable=import-outside-toplevel
    import torch.distributed as dist  # pylint: disable=import-outside-toplevel

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://{address}", rank=rank,
                            world_size=world)
    out = {}
    for size in sizes:
        x = torch.ones(max(size // 4, 1), dtype=torch.float32)
        steps = steps_for(size)
        dist.all_reduce(x)
        times = []
        for _ in range(repeats):
            dist.barrier()
            start = time.perf_counter()
            for _ in range(steps):
                dist.all_reduce(x)
            times.append((time.perf_counter() - start) / steps)
        out[size] = times
    dist.destroy_process_group()
    return out


class _Schedule:
    """A registered algorithm's schedule, run as written (no shared-memory sum)."""

    def __init__(self, name):
        from tfdist_ext import collectives  # pylint: disable=import-outside-toplevel

        self.name = name
        self.schedule = collectives.ALGORITHMS.get(name).schedule

    def __str__(self):
        return self.name


def run(args):
    import tensorflow as tf  # pylint: disable=import-outside-toplevel

    import tfdist_ext  # pylint: disable=import-outside-toplevel
    from tfdist_ext.collectives import calibration, options  # pylint: disable=import-outside-toplevel

    tf.get_logger().setLevel("ERROR")
    ucx = tfdist_ext.Strategy(engine="ucx", num_replicas=args.replicas)
    graph = tfdist_ext.Strategy(engine="tf", allreduce="ring", num_replicas=args.replicas)
    ucx_ops = ucx.extended.cross_device_ops
    tf_ops = graph.extended.cross_device_ops
    world = ucx.num_replicas_in_sync
    spec = ucx.cluster
    rank = spec.task_index if spec else 0
    sizes = [options.parse_size(s) for s in args.sizes.split(",")]

    def steps_for(size):
        return args.steps or (8 if size < (1 << 20) else 2)

    barrier = calibration.barrier_fn(tf_ops)
    # The machine's speed drifts: memcpy is timed before and after the rows.
    memcpy_start = memcpy_gbps(max(sizes)) if rank == 0 else None
    rows = {}
    for size in sizes:
        n, steps = max(size // 4, 1), steps_for(size)
        fns = {f"ucx:{a}": calibration.all_reduce_fn(ucx_ops, a, n, steps)
               for a in args.ucx.split(",") if a}
        fns.update({f"ucx-sched:{a}": calibration.all_reduce_fn(
            ucx_ops, _Schedule(a), n, steps) for a in args.ucx_schedules.split(",") if a})
        fns.update({f"tf:{a}": calibration.all_reduce_fn(tf_ops, a, n, steps)
                    for a in args.tf.split(",") if a})
        for name, times in calibration.time_interleaved(fns, args.repeat, barrier, steps).items():
            rows[(name, size)] = times
        if rank == 0:
            print(f"{size:>10} " + "  ".join(
                f"{name} {1e3 * np.median(rows[(name, size)]):.3f} ms" for name in fns),
                flush=True)
    concurrent = None
    if barrier is not None:  # every worker copies its own buffer at once
        barrier()
        concurrent = memcpy_gbps(max(sizes), repeats=41, stat=np.median)
    has_torch = False
    if not args.no_gloo and spec is not None:
        try:
            import torch  # noqa: F401  pylint: disable=import-outside-toplevel,unused-import
            has_torch = True
        except ImportError:
            if rank == 0:
                print("torch is not installed: no Gloo rows (pip install torch)", flush=True)
    if has_torch:
        if args.hosts:  # Gloo takes the hostname's address (127.0.0.1) unless told the device
            os.environ.setdefault("GLOO_SOCKET_IFNAME", host_device())
        host, port = spec.jobs["worker"][0].rsplit(":", 1)
        for size, times in gloo_times(sizes, steps_for, args.repeat, rank, world,
                                      f"{host}:{int(port) + 1}").items():
            rows[("gloo", size)] = times
    per_host = int(args.hosts.split("x")[1]) if args.hosts else None
    link = link_stream_gbps(spec, rank, per_host, barrier) if per_host else None
    if rank != 0:
        return 0
    memcpy_end = memcpy_gbps(max(sizes))
    limits = {"memcpy_GBps": max(memcpy_start, memcpy_end), "memcpy_GBps_start": memcpy_start,
              "memcpy_GBps_end": memcpy_end, "memcpy_concurrent_GBps": concurrent,
              "loopback_tcp_GBps": loopback_tcp_gbps(), "hosts": args.hosts,
              "link_bandwidth": args.link_bandwidth, "link_stream_GBps": link}
    records = []
    for (name, size), times in rows.items():
        t_min, t_med = min(times), float(np.median(times))
        algbw = size / t_med / 1e9
        records.append({"engine": name.split(":")[0].split("-")[0], "row": name,
                        "world": world,
                        "placement": "workers" if spec else "replicas",
                        "transport": args.transport, "bytes": size,
                        "time_ms_min": 1e3 * t_min, "time_ms_median": 1e3 * t_med,
                        "algbw_GBps": algbw,
                        "busbw_GBps": algbw * (2 * (world - 1) / world if world > 1 else 1.0),
                        "algbw_over_memcpy": algbw / limits["memcpy_GBps"],
                        "algbw_over_concurrent_memcpy": (algbw / concurrent if concurrent
                                                         else None),
                        "x_link": (size * 2 * (world - 1) / world / (link * 1e9) / t_med
                                   if link else None), **limits})
    summarize(records, args, limits)
    return 0


def summarize(records, args, limits):
    by = {(r["row"], r["bytes"]): r for r in records}
    for r in records:
        for base in ("gloo", "tf:native"):
            other = by.get((base, r["bytes"]))
            if other is not None:
                r[f"speedup_vs_{base.replace(':', '_')}"] = (other["time_ms_median"]
                                                              / r["time_ms_median"])
    concurrent = limits["memcpy_concurrent_GBps"]
    print(f"limits: memcpy {limits['memcpy_GBps']:.2f} GB/s (start "
          f"{limits['memcpy_GBps_start']:.2f}, end {limits['memcpy_GBps_end']:.2f}"
          + (f"; every worker at once: {concurrent:.2f} each" if concurrent else "")
          + "), loopback TCP "
          f"{limits['loopback_tcp_GBps']:.2f} GB/s; UCX transport: {args.transport}"
          + (f"; hosts {args.hosts}, link {args.link_bandwidth or 'unshaped'}, one stream "
             f"{limits['link_stream_GBps']:.3f} GB/s" if args.hosts else ""))
    print(f"{'bytes':>10} {'row':<16} {'min ms':>9} {'med ms':>9} {'algbw':>7} {'busbw':>7} "
          f"{'/memcpy':>7} {'/at once':>8} {'x gloo':>7} {'x tf':>7} {'x link':>7}")
    for r in sorted(records, key=lambda r: (r["bytes"], r["row"])):
        print(f"{r['bytes']:>10} {r['row']:<16} {r['time_ms_min']:9.3f} "
              f"{r['time_ms_median']:9.3f} {r['algbw_GBps']:7.3f} {r['busbw_GBps']:7.3f} "
              f"{r['algbw_over_memcpy']:7.2f} "
              f"{r['algbw_over_concurrent_memcpy'] or float('nan'):8.2f} "
              f"{r.get('speedup_vs_gloo', float('nan')):7.2f} "
              f"{r.get('speedup_vs_tf_native', float('nan')):7.2f} "
              f"{r['x_link'] or float('nan'):7.2f}")
    # Every record gets the commit (as before, from `limits`) and the machine.
    harness.write(records, args.json, args.png, plot=lambda path: plot(records, path, limits))


def plot(records, path, limits):
    import matplotlib  # pylint: disable=import-outside-toplevel
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # pylint: disable=import-outside-toplevel

    fig, ax = plt.subplots(figsize=(8, 5))
    for row in sorted({r["row"] for r in records}):
        pts = sorted((r for r in records if r["row"] == row), key=lambda r: r["bytes"])
        ax.plot([r["bytes"] for r in pts], [r["algbw_GBps"] for r in pts], marker="o",
                label=row, linewidth=3 if row.startswith("ucx") else 1.2)
    ax.axhline(limits["loopback_tcp_GBps"], color="gray", linestyle="--",
               label="loopback TCP stream")
    if limits.get("link_stream_GBps"):
        ax.axhline(limits["link_stream_GBps"], color="red", linestyle="--",
                   label="one TCP stream between hosts")
    ax.axhline(limits["memcpy_GBps"], color="black", linestyle=":", label="memcpy")
    first = records[0]
    ax.set(xscale="log", yscale="log", xlabel="bytes (float32)", ylabel="algbw GB/s (median)",
           title=f"All-reduce on {first['world']} {first['placement']}"
                 + (f", hosts {first['hosts']}, link {first['link_bandwidth'] or 'unshaped'}"
                    if first.get("hosts") else f", UCX transport: {first['transport']}"))
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    pathlib.Path(path).parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    args = parse_args(argv)
    if args.workers and "TF_CONFIG" not in os.environ:
        return relaunch(args, argv)
    return run(args)


if __name__ == "__main__":
    sys.exit(main())
