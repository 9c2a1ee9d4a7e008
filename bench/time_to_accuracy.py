"""Time-to-accuracy of gradient compression and all-reduce choices on a (shaped) link.

    python bench/time_to_accuracy.py --workers 2 --link 100mbit --models cnn,mlp \
        --configs sync,topk,qsgd,fp16 --epochs 15 --json out.json --png out.png
    python bench/time_to_accuracy.py --link none --models cnn --configs sync,fp16 --epochs 1

For every (model, config) the script re-launches itself in worker mode through
`python -m tfdist_ext.launch -np W [--link-bandwidth RATE]` (one launch per run;
a shaped link needs root). Each worker trains with Keras `model.fit` on mnist1d
under `tfdist_ext.Strategy(**config)` and, after every epoch, records the training
wall-clock seconds since the start of `fit` (the time spent in the per-epoch test
evaluation is left out), the cumulative gradient bytes it sent
(`strategy.communication_stats()`) and the test accuracy. The chief's records are
collected; the summary per model gives each config's final accuracy, the time at
which it first reaches the target (sync's final accuracy - 1 point) and how many
times sooner than sync that is.

Across regions: `--hosts 2x2 --link 50mbit --latency 100ms` runs 2 emulated hosts of 2
workers (`tfdist-run -H 2x2`), the links between hosts shaped to 50 Mbit/s and delayed
by 100 ms one way.

Configs: sync (native all-reduce, dense), ring, hierarchical, topk, qsgd, fp16, bf16,
auto, powersgd, powersgd4 (rank 4), adaptive, dga (delayed averaging, delay 1),
localsgd (period 8), diloco (period 8), or a JSON dict of Strategy keyword arguments,
e.g. '{"compression": {"name": "topk", "ratio": 0.1}}'.
Models: cnn (the example's 1-D CNN, ~26k parameters, Adam 3e-3), mlp (Dense
40-1024-1024-10 with ReLU, ~1.1M parameters = 4.4 MB of float32 gradients, Adam 1e-3)
and widecnn (the CNN with 64/128/128 channels and a 512-unit head, ~0.74M parameters =
2.9 MB of gradients, Adam 1e-3; keeps learning for tens of epochs).
"""

import argparse
import json
import os
import pathlib
import sys
import tempfile
import time

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench import harness  # pylint: disable=wrong-import-position
from bench._relaunch import relaunch  # pylint: disable=wrong-import-position

CONFIGS = {"sync": {}, "topk": {"compression": "topk"}, "qsgd": {"compression": "qsgd"},
           "fp16": {"compression": "fp16"}, "auto": {"allreduce": "auto"},
           "powersgd": {"compression": "powersgd"}, "bf16": {"compression": "bf16"},
           "powersgd4": {"compression": {"name": "powersgd", "rank": 4}},
           "adaptive": {"compression": "adaptive"},
           "ring": {"allreduce": "ring"}, "hierarchical": {"allreduce": "hierarchical"},
           "dga": {"sync": {"name": "delayed_averaging", "delay": 1}},
           "localsgd": {"sync": {"name": "local_sgd", "period": 8}},
           "diloco": {"sync": {"name": "diloco", "period": 8}}}
LEARNING_RATES = {"cnn": 3e-3, "mlp": 1e-3, "widecnn": 1e-3}
GLOBAL_BATCH = 128


def build(name, keras):
    """The Keras model called `name` ("cnn" or "mlp"), not compiled."""
    from examples.keras_fit import build_model  # pylint: disable=import-outside-toplevel
    return build_model(keras, name)


def strategy_kwargs(config):
    """Strategy keyword arguments of a config name or JSON dict.

    Raises:
        ValueError: for an unknown name or malformed JSON, naming the valid forms.
    """
    if config in CONFIGS:
        return dict(CONFIGS[config])
    if config.lstrip().startswith("{"):
        try:
            value = json.loads(config)
        except json.JSONDecodeError as err:
            raise ValueError(f"config {config!r} is not valid JSON: {err}") from None
        if isinstance(value, dict):
            return value
    raise ValueError(f"unknown config {config!r}; use one of {', '.join(CONFIGS)} or a JSON "
                     "dict of Strategy keyword arguments, e.g. '{\"compression\": \"int8\"}'")


def split_list(text):
    """Splits "a,b,{"x": 1, "y": 2}" at the commas outside braces."""
    items, depth, current = [], 0, ""
    for char in text:
        depth += {"{": 1, "}": -1}.get(char, 0)
        if char == "," and depth == 0:
            items.append(current.strip())
            current = ""
        else:
            current += char
    return [item for item in items + [current.strip()] if item]


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", type=int, default=2, help="worker processes (default 2)")
    parser.add_argument("--link", default="none",
                        help="tc rate of every worker's link (100mbit, 1gbit; needs root) "
                             "or 'none' for plain 127.0.0.1 (default)")
    parser.add_argument("--hosts", default=None, metavar="HxW",
                        help="H emulated hosts of W workers (overrides --workers; --link "
                             "and --latency then shape the links between hosts)")
    parser.add_argument("--latency", default=None, metavar="DELAY",
                        help="one-way delay of the links, e.g. 100ms (needs root)")
    parser.add_argument("--models", default="cnn,mlp",
                        help="comma-separated: cnn, mlp, widecnn")
    parser.add_argument("--configs", default="sync,topk,qsgd,fp16",
                        help=f"comma-separated: {', '.join(CONFIGS)} or JSON dicts")
    parser.add_argument("--epochs", default="15",
                        help="epochs for every model, or per model: 'cnn=15,mlp=8'")
    parser.add_argument("--seed", type=int, default=0, help="same for every config")
    parser.add_argument("--collective-timeout", type=float, default=None, metavar="S",
                        help="the UCX engine's no-progress timeout for every config "
                             "(default: the strategy's, 30 s)")
    parser.add_argument("--timeout", type=float, default=1800, help="seconds per launch")
    parser.add_argument("--check", action="store_true",
                        help="measure the shaped link before the first run (tfdist-run --check)")
    parser.add_argument("--json", default=None, help="write records and summary here")
    parser.add_argument("--png", default=None, help="plot test accuracy vs seconds here")
    worker = parser.add_argument_group("worker mode (used by the launches)")
    worker.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    worker.add_argument("--model", default=None, help=argparse.SUPPRESS)
    worker.add_argument("--config", default=None, help=argparse.SUPPRESS)
    worker.add_argument("--out", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    try:
        args.model_list = split_list(args.models)
        for model in args.model_list:
            if model not in LEARNING_RATES:
                raise ValueError(f"unknown model {model!r}; use cnn, mlp or widecnn")
        args.config_list = split_list(args.configs)
        for config in args.config_list:
            strategy_kwargs(config)
        epochs = dict(item.split("=") if "=" in item else ("*", item)
                      for item in split_list(args.epochs))
        args.epochs_of = {m: int(epochs.get(m, epochs.get("*", 0))) for m in args.model_list}
        if min(args.epochs_of.values()) < 1:
            raise ValueError(f"--epochs must give every model >= 1 epoch; got {args.epochs!r}")
        if args.hosts:
            height, _, width = args.hosts.partition("x")
            args.workers = int(height) * int(width)
    except ValueError as err:
        parser.error(str(err))
    if args.link != "none" and not args.worker:
        from tfdist_ext.launch import linkspec, netbed  # pylint: disable=import-outside-toplevel
        try:
            linkspec.parse_rate(args.link)
            netbed.check_available(latency=bool(args.latency))
        except (ValueError, netbed.NetBedError) as err:
            parser.error(f"--link {args.link}: {err} (--link none: plain 127.0.0.1)")
    return args


def worker(args):
    """Trains one (model, config) on this worker and writes its per-epoch records."""
    import keras  # pylint: disable=import-outside-toplevel

    import tfdist_ext  # pylint: disable=import-outside-toplevel
    from examples.keras_fit import load_mnist1d  # pylint: disable=import-outside-toplevel

    kwargs = strategy_kwargs(args.config)
    if args.collective_timeout is not None:
        from tfdist_ext.collectives import engines  # pylint: disable=import-outside-toplevel
        allreduce = kwargs.get("allreduce") or engines.default_algorithm(
            engines.resolve(kwargs.get("engine")))
        allreduce = allreduce if isinstance(allreduce, dict) else {"name": allreduce}
        kwargs["allreduce"] = dict(allreduce, timeout_seconds=args.collective_timeout)
    strategy = tfdist_ext.Strategy(**kwargs)
    index = strategy.cluster.task_index if strategy.cluster else 0
    keras.utils.set_random_seed(args.seed)
    x_train, y_train, x_test, y_test = load_mnist1d()
    with strategy.scope():
        model = build(args.model, keras)
        model.compile(optimizer=keras.optimizers.Adam(LEARNING_RATES[args.model]),
                      loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                      metrics=["accuracy"])
    records = []

    class Recorder(keras.callbacks.Callback):
        """Per epoch: training seconds, bytes sent, test accuracy."""

        def on_train_begin(self, logs=None):
            self.start, self.eval_seconds = time.perf_counter(), 0.0

        def on_epoch_end(self, epoch, logs=None):
            seconds = time.perf_counter() - self.start - self.eval_seconds
            tick = time.perf_counter()
            _, accuracy = self.model.evaluate(x_test, y_test, batch_size=256, verbose=0)
            self.eval_seconds += time.perf_counter() - tick
            stats = strategy.communication_stats()
            records.append({
                "model": args.model, "config": args.config,
                "workers": strategy.num_replicas_in_sync, "link": args.link,
                "hosts": args.hosts, "latency": args.latency,
                "epoch": epoch + 1, "seconds": seconds, "bytes_sent": stats["bytes_sent"],
                "dense_bytes": stats["dense_bytes"], "test_accuracy": float(accuracy),
                "train_loss": float(logs["loss"]),
                "choices": [b["choice"] for d in strategy.compression_decisions[-1:]
                            for b in d["buckets"]]})
            if index == 0:
                print(f"{args.model} {args.config} epoch {epoch + 1}: {seconds:.1f} s, "
                      f"{stats['bytes_sent'] / 1e6:.1f} MB sent, test accuracy "
                      f"{accuracy:.4f}", flush=True)

    model.fit(x_train, y_train, batch_size=GLOBAL_BATCH, epochs=args.epochs_of[args.model],
              shuffle=True, verbose=0, callbacks=[Recorder()])
    pathlib.Path(args.out.replace("{worker}", str(index))).write_text(json.dumps(records))
    return 0


def launch(args, model, config, tag, directory, check):
    """One `tfdist_ext.launch` job of `model` under `config`; returns the chief's records."""
    out = os.path.join(directory, f"{model}-{tag}-w{{worker}}.json")
    relaunch(__file__, args.workers,
             ["--worker", "--model", model, "--models", model, "--config", config,
              "--link", args.link,
              "--epochs", args.epochs_of[model], "--seed", args.seed, "--out", out,
              *(["--collective-timeout", args.collective_timeout]
                if args.collective_timeout is not None else []),
              *(["--hosts", args.hosts] if args.hosts else []),
              *(["--latency", args.latency] if args.latency else [])],
             args.timeout, link=args.link, check=check, hosts=args.hosts,
             latency=args.latency)
    return json.loads(pathlib.Path(out.replace("{worker}", "0")).read_text())


def summarize(records):
    """Per model: final accuracy, time to (sync final - 1 point) and sync_time / time."""
    summary = []
    for model in dict.fromkeys(r["model"] for r in records):
        rows = {}
        for r in records:
            if r["model"] == model:
                rows.setdefault(r["config"], []).append(r)
        final = {c: rs[-1]["test_accuracy"] for c, rs in rows.items()}
        target = final["sync"] - 0.01 if "sync" in final else None
        reach = {c: next((r["seconds"] for r in rs if target is not None
                          and r["test_accuracy"] >= target), None) for c, rs in rows.items()}
        base = reach.get("sync")
        for config, rs in rows.items():
            summary.append({
                "model": model, "config": config, "final_accuracy": final[config],
                "epochs": rs[-1]["epoch"], "total_seconds": rs[-1]["seconds"],
                "total_bytes_sent": rs[-1]["bytes_sent"], "target_accuracy": target,
                "time_to_target": reach[config],
                "x_sooner": base / reach[config] if base and reach[config] else None})
    return summary


def _link(args):
    text = args.link + (f", {args.latency} one way" if args.latency else "")
    return text + (" between hosts" if args.hosts else "")


def print_table(summary, args):
    print(f"\ntime to accuracy: {args.hosts or args.workers} workers, link {_link(args)}, global batch "
          f"{GLOBAL_BATCH}, seed {args.seed}", flush=True)
    print(f"{'model':<5} {'config':<12} {'epochs':>6} {'final acc':>9} {'target':>7} "
          f"{'MB sent':>9} {'total s':>8} {'s to target':>11} {'x sooner':>8}")
    fmt = lambda v, spec: "-" if v is None else format(v, spec)  # noqa: E731
    for s in summary:
        print(f"{s['model']:<5} {s['config']:<12} {s['epochs']:>6} {s['final_accuracy']:>9.4f} "
              f"{fmt(s['target_accuracy'], '.4f'):>7} {s['total_bytes_sent'] / 1e6:>9.1f} "
              f"{s['total_seconds']:>8.1f} {fmt(s['time_to_target'], '.1f'):>11} "
              f"{fmt(s['x_sooner'], '.2f'):>8}", flush=True)


def plot(records, summary, args, path):
    import matplotlib  # pylint: disable=import-outside-toplevel
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # pylint: disable=import-outside-toplevel

    models = list(dict.fromkeys(r["model"] for r in records))
    fig, axes = plt.subplots(1, len(models), figsize=(6 * len(models), 4.5), squeeze=False)
    for ax, model in zip(axes[0], models):
        for config in dict.fromkeys(r["config"] for r in records if r["model"] == model):
            rows = [r for r in records if r["model"] == model and r["config"] == config]
            ax.plot([r["seconds"] for r in rows], [r["test_accuracy"] for r in rows],
                    marker="o", markersize=3, label=config,
                    linewidth=2.5 if config == "sync" else 1.3)
        target = next(s["target_accuracy"] for s in summary if s["model"] == model)
        if target is not None:
            ax.axhline(target, color="gray", linestyle="--", linewidth=1,
                       label=f"target {target:.3f}")
        ax.set(xlabel="training wall-clock seconds", ylabel="test accuracy",
               title=f"{model}: {args.hosts or args.workers} workers, link {_link(args)}")
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=8)
    fig.tight_layout()
    pathlib.Path(path).parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)


def main(argv=None):
    args = parse_args(argv)
    if args.worker:
        return worker(args)
    records, failed = [], []
    with tempfile.TemporaryDirectory(prefix="tfdist_tta_") as directory:
        for model in args.model_list:
            for i, config in enumerate(args.config_list):
                check = args.check and not records and i == 0
                try:
                    records += launch(args, model, config, i, directory, check)
                except RuntimeError as err:  # the other configs still run
                    print(f"time_to_accuracy: {err}", file=sys.stderr, flush=True)
                    failed.append(f"{model} {config}")
                # so far, in case a later launch hangs
                harness.write({"records": records, "failed": failed}, args.json)
    summary = summarize(records)
    print_table(summary, args)
    harness.write({"records": records, "summary": summary, "failed": failed}, args.json,
                  args.png, plot=lambda path: plot(records, summary, args, path))
    if failed:
        print(f"time_to_accuracy: failed: {', '.join(failed)}", file=sys.stderr, flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
