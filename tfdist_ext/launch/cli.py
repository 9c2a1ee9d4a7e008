"""`tfdist-run -np N [--timeout S] [--] command args...` (also `python -m tfdist_ext.launch`).

Examples:
    tfdist-run -np 2 python examples/keras_fit.py --epochs 5
    tfdist-run -np 4 --timeout 600 -- python train.py --lr 0.1
    tfdist-run -np 2 --link-bandwidth 50mbit --check -- python train.py  # needs root
    tfdist-run -np 2 --link-bandwidth 50mbit --link-latency 50ms -- python train.py
    tfdist-run -H 2x2 --link-bandwidth 100mbit -- python train.py  # 2 hosts of 2 workers
"""

import argparse
import os
import re
import signal
import socket
import sys

from tfdist_ext import startup
from tfdist_ext.launch import linkspec, netbed, output, preload, profiling
from tfdist_ext.launch.launcher import Launcher


def _positive(kind, minimum):
    def parse(text):
        try:
            value = kind(text)
        except ValueError:
            value = None
        if value is None or value < minimum:
            raise argparse.ArgumentTypeError(
                f"must be a number >= {minimum}; received {text!r}")
        return value
    return parse


def _rate(text):
    try:
        linkspec.parse_rate(text)
    except ValueError as err:
        raise argparse.ArgumentTypeError(str(err)) from None
    return text


def _local_names():
    names = {"localhost", "127.0.0.1", "::1", socket.gethostname()}
    try:
        names.add(socket.getfqdn())
    except OSError:
        pass
    return names


def _hosts(text):
    """Horovod's -H spelling, this machine only: "localhost:4" -> 4 slots; or an
    emulated layout "HxW" -> (H, W): H hosts (network namespaces) of W workers."""
    layout = re.fullmatch(r"\s*(\d+)\s*x\s*(\d+)\s*", text)
    if layout:
        hosts, per_host = int(layout.group(1)), int(layout.group(2))
        if hosts < 1 or per_host < 1:
            raise argparse.ArgumentTypeError(
                f"{text!r}: the layout HxW needs H >= 1 hosts and W >= 1 workers per host "
                f"(as in 2x2)")
        return hosts, per_host
    slots = 0
    for entry in text.split(","):
        name, _, count = entry.strip().rpartition(":") if ":" in entry else (entry, "", "1")
        name = name.strip()
        if not count.strip().isdigit() or int(count) < 1:
            raise argparse.ArgumentTypeError(
                f"{entry!r} is not HOST:SLOTS with SLOTS >= 1 (as in localhost:4), nor a "
                f"layout HxW of emulated hosts (as in 2x2)")
        if name not in _local_names():
            raise argparse.ArgumentTypeError(
                f"host {name!r} is not this machine: tfdist-run starts workers here only "
                f"(use localhost:N, or HxW to emulate H hosts of W workers). On several "
                f"machines, start one worker per process with its TF_CONFIG (README, "
                f"'Several hosts').")
        slots += int(count)
    return slots


def _delay(text):
    try:
        linkspec.parse_latency(text)
    except ValueError as err:
        raise argparse.ArgumentTypeError(str(err)) from None
    return text


class _Stopped(BaseException):
    """SIGINT/SIGTERM while the network test bed is being built or checked."""


def _stop(signum, _frame):
    raise _Stopped(signum)


def _run_shaped(args, command, launcher, layout) -> int:
    """Builds the test bed, optionally checks it, runs the job, always tears down."""
    latency = linkspec.parse_latency(args.link_latency) if args.link_latency else None
    bed = netbed.NetBed(args.num_workers, args.link_bandwidth, log=launcher.say,
                        latency=latency, num_hosts=layout[0] if layout else None,
                        num_servers=args.num_servers)
    handlers = {sig: signal.signal(sig, _stop) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        with bed:
            launcher.network = bed
            if args.check:
                from tfdist_ext.launch import netcheck  # pylint: disable=import-outside-toplevel
                peer = bed.per_host  # worker 0's first peer on another host
                launcher.say(f"link check, worker 0 -> worker {peer}: "
                             f"{netcheck.measure(bed, receiver=peer)}.")
            return launcher.run() if command else 0
    except _Stopped as stop:
        name = signal.Signals(stop.args[0]).name
        launcher.say(f"received {name}; network test bed removed.")
        return 128 + stop.args[0]
    finally:
        for sig, handler in handlers.items():
            signal.signal(sig, handler)


def _profile_steps(value):
    try:
        profiling.parse_steps(value, name="--profile-steps")
    except ValueError as err:
        raise argparse.ArgumentTypeError(str(err)) from None
    return value


def _output_mode(value):
    try:
        return output.check_mode(value)
    except ValueError as err:
        raise argparse.ArgumentTypeError(str(err)) from None


def _preload(value):
    try:
        return preload.modules_from(value)
    except ValueError as err:
        raise argparse.ArgumentTypeError(str(err)) from None


def build_parser():
    # allow_abbrev=False: argparse would otherwise match prefixes of our options
    # inside the worker's own arguments (`train.py --link x` -> "ambiguous option").
    parser = argparse.ArgumentParser(
        prog="tfdist-run", allow_abbrev=False,
        description="Run N TensorFlow workers on this machine, each with its TF_CONFIG.",
        epilog="Exit code: the first non-zero worker exit code (128+N if killed by "
               "signal N), 124 on --timeout, 0 when every worker succeeded.")
    parser.add_argument("-np", "--num-workers", dest="num_workers", default=None,
                        type=_positive(int, 1), metavar="N",
                        help="number of worker processes (>= 1)")
    parser.add_argument("--ps", dest="num_servers", type=_positive(int, 0), default=0,
                        metavar="M",
                        help="also start M parameter servers (TF_CONFIG job \"ps\", same "
                             "command) for Strategy(sync='async'); not counted in -np. "
                             "With --link-* or -H HxW each server gets a host of its own "
                             "(numbered after the workers' hosts)")
    parser.add_argument("-H", "--hosts", type=_hosts, default=None,
                        metavar="localhost:N|HxW",
                        help="Horovod's spelling, for this machine only: N slots; -np "
                             "defaults to N and may not exceed it. Or HxW: emulate H hosts "
                             "of W workers (one network namespace per host, workers of a "
                             "host on its loopback, --link-* shaping the links between "
                             "hosts; needs root); -np defaults to H*W and must equal it")
    parser.add_argument("--timeout", type=_positive(float, 0.001), default=None,
                        metavar="S", help="stop the whole job after S seconds (exit 124)")
    parser.add_argument("--grace", type=_positive(float, 0.0), default=3.0, metavar="S",
                        help="seconds between SIGTERM and SIGKILL when stopping workers "
                             "(default 3)")
    parser.add_argument("--max-restarts", type=_positive(int, 0), default=None, metavar="N",
                        help="start the whole job again, up to N times, when a worker "
                             "fails (not after --timeout or a signal); workers read the "
                             "attempt in TFDIST_RESTART. With keras.callbacks."
                             "BackupAndRestore, training resumes from the last backup. "
                             "With --elastic: start a failed worker again, up to N times "
                             "in all (default: 3 per worker)")
    parser.add_argument("--elastic", action="store_true",
                        help="a worker that dies does not stop the job: "
                             "the others go on without it and it is started again to "
                             "rejoin (Strategy(elastic=True), turned "
                             "on for an unchanged script through TFDIST_ELASTIC=1)")
    parser.add_argument("--output", type=_output_mode, default="chief", metavar="WHICH",
                        help="'chief' (default): worker 0's live progress bar and each "
                             "line once (another worker's line only where it differs); "
                             "'all': every worker's lines; N: worker N's only")
    parser.add_argument("--preload", type=_preload, default=None, metavar="MODULES",
                        help="import MODULES (comma-separated, e.g. tensorflow,keras) once "
                             "in a template process and fork each worker from it instead "
                             "of starting a fresh Python: a worker and an elastic "
                             "replacement skip the imports (default: $TFDIST_PRELOAD, "
                             "else none; applies to `python script.py` and `python -m "
                             "module`)")
    parser.add_argument("-v", "--verbose", action="store_true",
                        help="show TensorFlow's C++ log lines (filtered by default)")
    parser.add_argument("--link-bandwidth", type=_rate, default=None, metavar="RATE",
                        help="run each worker in its own network namespace with every "
                             "link shaped to RATE each way (tc syntax: 100kbit, 50mbit, "
                             "1gbit); needs root and iproute2")
    parser.add_argument("--link-latency", type=_delay, default=None, metavar="DELAY",
                        help="run each worker (or -H host) in its own network namespace "
                             "and delay every packet between two of them by DELAY one "
                             "way (50ms: 100 ms round trip), or per pair of hosts "
                             "(0:1=100ms,0:2=30ms; hosts are workers without -H HxW); "
                             "combines with --link-bandwidth; needs root, iptables and "
                             "the fnfqueue package")
    parser.add_argument("--check", action="store_true",
                        help="with --link-bandwidth or --link-latency: measure the round "
                             "trip and TCP throughput from worker 0 to worker 1 before "
                             "running the command (which may be omitted)")
    parser.add_argument("--profile", default=None, metavar="DIR",
                        help="profile training steps of every worker with TF's profiler "
                             "into the TensorBoard log directory DIR (one session of the "
                             "Profile tab, a host per worker; see --profile-steps)")
    parser.add_argument("--profile-steps", type=_profile_steps, default=None,
                        metavar="A-B",
                        help="with --profile: the training steps to trace, counted from 0 "
                             f"across epochs (default {profiling.DEFAULT_STEPS[0]}-"
                             f"{profiling.DEFAULT_STEPS[1]})")
    parser.add_argument("command", nargs=argparse.REMAINDER,
                        help="the program to run and its arguments")
    return parser


def main(argv=None) -> int:
    startup.release()  # a TF_CONFIG in the launcher's own environment is not its cluster
    parser = build_parser()
    args = parser.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if args.num_workers is None and args.hosts is None:
        parser.error("the following arguments are required: -np/--num-workers "
                     "(or -H localhost:N)")
    layout = args.hosts if isinstance(args.hosts, tuple) else None
    if layout:
        if args.num_workers is not None and args.num_workers != layout[0] * layout[1]:
            parser.error(f"argument -np: {args.num_workers} workers do not match the layout "
                         f"-H {layout[0]}x{layout[1]} ({layout[0] * layout[1]} workers); "
                         f"drop -np or make it {layout[0] * layout[1]}")
        args.num_workers = layout[0] * layout[1]
    elif args.num_workers is None:
        args.num_workers = args.hosts
    elif args.hosts is not None and args.num_workers > args.hosts:
        parser.error(f"argument -np: {args.num_workers} workers do not fit the "
                     f"{args.hosts} slots of -H; raise the slots (-H localhost:"
                     f"{args.num_workers}) or lower -np")
    if args.link_latency is not None:
        pairs = linkspec.parse_latency(args.link_latency)
        count = (layout[0] if layout else args.num_workers) + args.num_servers
        for a, b in pairs if isinstance(pairs, dict) else ():
            if max(a, b) >= count:
                parser.error(f"argument --link-latency: the pair {a}:{b} names host "
                             f"{max(a, b)}, but there are {count} hosts (0..{count - 1}; "
                             f"each worker is one without -H HxW, and each --ps server "
                             f"one after them)")
    shaped = (args.link_bandwidth is not None or args.link_latency is not None
              or layout is not None)
    if args.check and (not shaped or args.num_workers < 2 or (layout and layout[0] < 2)):
        parser.error("argument --check: needs --link-bandwidth, --link-latency or "
                     "-H HxW, and two workers on different hosts")
    if args.elastic and args.num_servers:
        parser.error("argument --elastic: not with --ps (elastic training goes on in the "
                     "surviving processes, with synchronous training only)")
    if args.max_restarts is None:
        args.max_restarts = 3 * args.num_workers if args.elastic else 0
    if args.profile_steps is not None and args.profile is None:
        parser.error("argument --profile-steps: needs --profile DIR")
    if args.profile is not None:  # the workers inherit the launcher's environment
        os.environ[profiling.DIR] = os.path.abspath(args.profile)
        if args.profile_steps is not None:
            os.environ[profiling.STEPS] = args.profile_steps
    if not command and not args.check:
        parser.error("no command given; e.g. `tfdist-run -np 2 python train.py`")
    if shaped:
        try:
            netbed.check_available(latency=args.link_latency is not None)
        except netbed.NetBedError as err:
            parser.error(str(err))
    launcher = Launcher(args.num_workers, command, timeout=args.timeout, grace=args.grace,
                        verbose=args.verbose, max_restarts=args.max_restarts,
                        num_servers=args.num_servers, output=args.output,
                        elastic=args.elastic, preload=args.preload)
    try:
        if shaped:
            return _run_shaped(args, command, launcher, layout)
        return launcher.run()
    except FileNotFoundError as err:
        launcher.say(f"cannot start {command[0]!r}: {err.strerror}.")
        launcher.stop_all()
        return 127


if __name__ == "__main__":
    sys.exit(main())
