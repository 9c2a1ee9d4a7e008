"""Every sync and compression mode x optimizer x dataset x world size x seed, against sync.

    python bench/modes_matrix.py --json docs/results/modes_matrix.json \
        --plot docs/results/modes_matrix.png

A cell is (dataset, optimizer, world size); in each, every mode trains the
same model from the same seed as synchronous SGD (`sync="sync"`, no
compression) and the test accuracies are compared: the mean over seeds of
(mode - sync), in points. The modes run at their defaults; a mode that warns
with this optimizer (`ModeOptimizerWarning`) is marked so in the cell.

Datasets (none of them used to tune a mode):

* ``digits``: scikit-learn's 8x8 digits (1,797 images), MLP 64-128-64-10,
  15 epochs.
* ``mnist1d``: 4,000 sequences (Greydanus 2020), MLP 40-256-256-10, 10 epochs.
* ``blobs``: scikit-learn's `make_classification` (6,000 samples, 40
  features, 10 classes), MLP with BatchNormalization and Dropout, 10 epochs.

Optimizers: ``sgd`` (SGD 0.1), ``momentum`` (SGD 0.1, momentum 0.9),
``adam`` (Adam 1e-3). Global batch 64 at every world size.

World sizes are logical CPU replicas in one process (`num_replicas`), which
run the same policy code as worker processes; ``async`` needs parameter
servers, so its cells run `tfdist-run -np W --ps 1` instead. Each cell is one
subprocess.
"""

import argparse
import json
import pathlib
import subprocess
import sys
import time
import warnings

import numpy as np

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))

import harness  # noqa: E402  pylint: disable=wrong-import-position  (bench/, above)

SYNC_MODES = ["stale_synchronous", "delayed_averaging", "local_sgd", "diloco",
              "model_averaging", "gossip"]
COMPRESSION_MODES = ["fp16", "bf16", "int8", "qsgd", "terngrad", "sign", "randomk", "topk",
                     "powersgd", "adaptive"]
PROCESS_MODES = ["async"]
DATASETS = {"digits": 15, "mnist1d": 10, "blobs": 10}  # name -> epochs
OPTIMIZERS = ["sgd", "momentum", "adam"]


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--datasets", default=",".join(DATASETS))
    parser.add_argument("--optimizers", default=",".join(OPTIMIZERS))
    parser.add_argument("--workers", default="2,4", help="world sizes")
    parser.add_argument("--seeds", default="0,1,2")
    parser.add_argument("--modes", default=",".join(SYNC_MODES + COMPRESSION_MODES
                                                    + PROCESS_MODES))
    parser.add_argument("--epochs", type=int, default=None, help="instead of each dataset's")
    parser.add_argument("--timeout", type=int, default=3600, help="seconds per cell")
    harness.add_arguments(parser, png=False)
    parser.add_argument("--plot", default=None)
    parser.add_argument("--records", default=None,
                        help="comma-separated --json files: summarize them instead of running "
                             "(a later file's run of the same cell, mode and seed wins)")
    parser.add_argument("--cell", default=None, help=argparse.SUPPRESS)
    return parser.parse_args(argv)


# -- one cell (a subprocess) --------------------------------------------------

def load(name, seed):
    """(x_train, y_train, x_test, y_test) of dataset `name`, split by `seed`."""
    from sklearn import datasets, model_selection  # pylint: disable=import-outside-toplevel

    if name == "mnist1d":
        sys.path.insert(0, str(ROOT / "examples"))
        from keras_fit import load_mnist1d  # pylint: disable=import-outside-toplevel
        return load_mnist1d()
    if name == "digits":
        x, y = datasets.load_digits(return_X_y=True)
        x = x / 16.0
    else:
        x, y = datasets.make_classification(
            n_samples=6000, n_features=40, n_informative=24, n_redundant=8, n_classes=10,
            n_clusters_per_class=2, class_sep=1.2, random_state=1234)
    x_train, x_test, y_train, y_test = model_selection.train_test_split(
        x.astype("float32"), y.astype("int32"), test_size=0.2, random_state=seed)
    return x_train, y_train, x_test, y_test


def build(keras, name):
    dense = keras.layers.Dense
    if name == "digits":
        layers = [dense(128, activation="relu"), dense(64, activation="relu")]
    elif name == "mnist1d":
        layers = [dense(256, activation="relu"), dense(256, activation="relu")]
    else:
        layers = []
        for units in (128, 64):
            layers += [dense(units), keras.layers.BatchNormalization(),
                       keras.layers.Activation("relu"), keras.layers.Dropout(0.2)]
    features = 64 if name == "digits" else 40
    return keras.Sequential([keras.Input((features,))] + layers + [dense(10)])


def optimizer(keras, name):
    if name == "sgd":
        return keras.optimizers.SGD(0.1)
    if name == "momentum":
        return keras.optimizers.SGD(0.1, momentum=0.9)
    return keras.optimizers.Adam(1e-3)


def train(cell, mode, seed, world):
    """Test accuracy, bytes sent and warnings of one mode on one seed."""
    import keras  # pylint: disable=import-outside-toplevel
    import tfdist_ext  # pylint: disable=import-outside-toplevel

    x_train, y_train, x_test, y_test = load(cell["dataset"], seed)
    keras.utils.set_random_seed(seed)
    sync = mode if mode in SYNC_MODES + PROCESS_MODES else "sync"
    compression = mode if mode in COMPRESSION_MODES else None
    replicas = None if mode in PROCESS_MODES else world
    strategy = tfdist_ext.Strategy(sync=sync, compression=compression, num_replicas=replicas)
    with strategy.scope():
        model = build(keras, cell["dataset"])
        model.compile(optimizer(keras, cell["optimizer"]),
                      keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                      metrics=["accuracy"])
    start = time.perf_counter()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            model.fit(x_train, y_train, batch_size=64, epochs=cell["epochs"], verbose=0)
            accuracy, error = float(model.evaluate(x_test, y_test, verbose=0)[1]), None
        except Exception as e:  # pylint: disable=broad-except  (recorded: a diverged mode)
            accuracy, error = None, f"{type(e).__name__}: {str(e)[:300]}"
    warned = [str(w.message) for w in caught if w.category.__name__ == "ModeOptimizerWarning"]
    stats = strategy.communication_stats()
    return {"accuracy": accuracy, "error": error, "warning": warned[0] if warned else None,
            "mb_sent": stats.get("bytes_sent", 0) / 1e6,
            "fit_seconds": time.perf_counter() - start}


def run_cell(cell):
    import os  # pylint: disable=import-outside-toplevel

    world = cell["world"]
    if cell["modes"] != PROCESS_MODES:
        import tensorflow as tf  # pylint: disable=import-outside-toplevel
        tf.config.set_logical_device_configuration(
            tf.config.list_physical_devices("CPU")[0],
            [tf.config.LogicalDeviceConfiguration() for _ in range(world)])
    task = json.loads(os.environ.get("TF_CONFIG", "{}")).get("task", {})
    chief = task.get("type", "worker") == "worker" and task.get("index", 0) == 0
    for seed in cell["seeds"]:
        for mode in cell["modes"]:
            record = dict(dataset=cell["dataset"], optimizer=cell["optimizer"], world=world,
                          mode=mode, seed=seed, **train(cell, mode, seed, world))
            if chief:
                print("RECORD " + json.dumps(record), flush=True)


# -- the driver ---------------------------------------------------------------

def launch(cell, timeout):
    command = [sys.executable, str(pathlib.Path(__file__).resolve()), "--cell", json.dumps(cell)]
    if cell["modes"] == PROCESS_MODES:
        command = [sys.executable, "-m", "tfdist_ext.launch", "-np", str(cell["world"]),
                   "--ps", "1", "--timeout", str(timeout)] + command
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=timeout,
                          check=False)
    # Under tfdist-run every line has its worker's "[0] " in front.
    records = [json.loads(line.split("RECORD ", 1)[1]) for line in done.stdout.splitlines()
               if "RECORD " in line]
    if done.returncode != 0:
        print(done.stderr[-3000:], file=sys.stderr)
    return records


def warns(mode, optimizer_name):
    """Whether the code as it is now warns for `mode` with the matrix's optimizer (runs
    recorded before a caution was added did not see it)."""
    import keras  # pylint: disable=import-outside-toplevel
    from tfdist_ext import compression, sync  # pylint: disable=import-outside-toplevel
    from tfdist_ext.keras import optimizer_check  # pylint: disable=import-outside-toplevel
    policy = sync.get(mode if mode in SYNC_MODES + PROCESS_MODES else "sync")
    compressor = compression.get(mode if mode in COMPRESSION_MODES else None)
    return bool(optimizer_check.cautions(policy, compressor, optimizer(keras, optimizer_name)))


def summarize(records):
    """Per cell and mode: mean points against sync over the seeds both ran; `warned`:
    the mode warns with the cell's optimizer now (`warned_in_runs`: in its runs)."""
    rows = []
    cells = dict.fromkeys((r["dataset"], r["optimizer"], r["world"]) for r in records)
    for dataset, opt, world in cells:
        group = [r for r in records if (r["dataset"], r["optimizer"], r["world"])
                 == (dataset, opt, world)]
        base = {r["seed"]: r["accuracy"] for r in group if r["mode"] == "sync"}
        for mode in dict.fromkeys(r["mode"] for r in group if r["mode"] != "sync"):
            runs = [r for r in group if r["mode"] == mode and r["seed"] in base]
            diffs = [100 * ((r["accuracy"] if r["accuracy"] is not None else 0.0)
                            - base[r["seed"]]) for r in runs]
            rows.append({"dataset": dataset, "optimizer": opt, "world": world, "mode": mode,
                         "points_vs_sync": float(np.mean(diffs)) if diffs else None,
                         "sync_accuracy": float(np.mean(list(base.values()))),
                         "accuracy": float(np.mean([r["accuracy"] or 0.0 for r in runs])),
                         "seeds": len(runs),
                         "errors": [r["error"] for r in runs if r["error"]],
                         "warned": warns(mode, opt),
                         "warned_in_runs": any(r["warning"] for r in runs),
                         "mb_sent": float(np.mean([r["mb_sent"] for r in runs]))})
    return rows


def plot(rows, path):
    import matplotlib  # pylint: disable=import-outside-toplevel
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # pylint: disable=import-outside-toplevel

    columns = list(dict.fromkeys((r["dataset"], r["optimizer"], r["world"]) for r in rows))
    modes = list(dict.fromkeys(r["mode"] for r in rows))
    grid = np.full((len(modes), len(columns)), np.nan)
    for r in rows:
        if r["points_vs_sync"] is not None:
            grid[modes.index(r["mode"]),
                 columns.index((r["dataset"], r["optimizer"], r["world"]))] = r["points_vs_sync"]
    fig, ax = plt.subplots(figsize=(1.0 + 0.55 * len(columns), 1.2 + 0.4 * len(modes)))
    image = ax.imshow(np.clip(grid, -10, 10), cmap="RdYlGn", vmin=-10, vmax=10, aspect="auto")
    for r in rows:
        i, j = modes.index(r["mode"]), columns.index((r["dataset"], r["optimizer"], r["world"]))
        text = "div" if r["errors"] else f"{r['points_vs_sync']:+.1f}"
        ax.text(j, i, text + ("*" if r["warned"] else ""), ha="center", va="center",
                fontsize=6)
    ax.set_xticks(range(len(columns)), [f"{d}\n{o}\nw{w}" for d, o, w in columns], fontsize=6)
    ax.set_yticks(range(len(modes)), modes, fontsize=7)
    fig.colorbar(image, ax=ax, label="points vs sync (mean over seeds)")
    ax.set_title("test accuracy minus sync's; * the mode warns with this optimizer", fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main(argv=None):
    args = parse_args(argv)
    if args.cell:
        run_cell(json.loads(args.cell))
        return 0
    if args.records:
        # A later file's run of the same (dataset, optimizer, world, mode, seed) replaces
        # an earlier one's: rerun the modes that changed and list the new file last.
        latest = {}
        for p in args.records.split(","):
            for r in json.loads(pathlib.Path(p).read_text())["records"]:
                latest[(r["dataset"], r["optimizer"], r["world"], r["mode"], r["seed"])] = r
        records = list(latest.values())
    else:
        records, modes = [], args.modes.split(",")
        in_process = ["sync"] + [m for m in modes if m not in PROCESS_MODES]
        for dataset in args.datasets.split(","):
            for opt in args.optimizers.split(","):
                for world in map(int, args.workers.split(",")):
                    cell = {"dataset": dataset, "optimizer": opt, "world": world,
                            "seeds": [int(s) for s in args.seeds.split(",")],
                            "epochs": args.epochs or DATASETS[dataset]}
                    for group in (in_process, [m for m in modes if m in PROCESS_MODES]):
                        if group:
                            records += launch(dict(cell, modes=group), args.timeout)
                    print(f"{dataset} {opt} w{world}: {len(records)} runs so far", flush=True)
    rows = summarize(records)
    failed = []
    for r in rows:
        flag = " (warns)" if r["warned"] else ""
        bad = r["errors"] or (r["points_vs_sync"] is not None and r["points_vs_sync"] < -2.0)
        if bad and not r["warned"]:
            failed.append(r)
        print(f"{r['dataset']:<8} {r['optimizer']:<9} w{r['world']} {r['mode']:<18} "
              f"{r['points_vs_sync']:+6.2f} points (sync {r['sync_accuracy']:.3f}, "
              f"{r['seeds']} seeds){flag}{' DIVERGED' if r['errors'] else ''}")
    harness.write({"args": vars(args), "summary": rows, "records": records,
                   "not_within_2_points_unwarned": failed},
                  args.json, args.plot, plot=lambda path: plot(rows, path))
    print(f"{len(failed)} unwarned cells more than 2 points below sync (or diverged)")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
