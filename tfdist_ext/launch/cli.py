"""`tfdist-run -np N [--timeout S] [--] command args...` (also `python -m tfdist_ext.launch`).

Examples:
    tfdist-run -np 2 python examples/keras_fit.py --epochs 5
    tfdist-run -np 4 --timeout 600 -- python train.py --lr 0.1
"""

import argparse
import sys

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


def build_parser():
    parser = argparse.ArgumentParser(
        prog="tfdist-run",
        description="Run N TensorFlow workers on this machine, each with its TF_CONFIG.",
        epilog="Exit code: the first non-zero worker exit code (128+N if killed by "
               "signal N), 124 on --timeout, 0 when every worker succeeded.")
    parser.add_argument("-np", "--num-workers", dest="num_workers", required=True,
                        type=_positive(int, 1), metavar="N",
                        help="number of worker processes (>= 1)")
    parser.add_argument("--timeout", type=_positive(float, 0.001), default=None,
                        metavar="S", help="stop the whole job after S seconds (exit 124)")
    parser.add_argument("--grace", type=_positive(float, 0.0), default=3.0, metavar="S",
                        help="seconds between SIGTERM and SIGKILL when stopping workers "
                             "(default 3)")
    parser.add_argument("-v", "--verbose", action="store_true",
                        help="show TensorFlow's C++ log lines (filtered by default)")
    parser.add_argument("command", nargs=argparse.REMAINDER,
                        help="the program to run and its arguments")
    return parser


def main(argv=None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        parser.error("no command given; e.g. `tfdist-run -np 2 python train.py`")
    launcher = Launcher(args.num_workers, command, timeout=args.timeout, grace=args.grace,
                        verbose=args.verbose)
    try:
        return launcher.run()
    except FileNotFoundError as err:
        launcher.say(f"cannot start {command[0]!r}: {err.strerror}.")
        launcher.stop_all()
        return 127


if __name__ == "__main__":
    sys.exit(main())
