"""bench/step.py's ratios between systems and its plot."""

import numpy as np

ONE_PROCESS = ("keras", "keras_xla")  # systems timed in one process, at any worker count


def summarize(rows):
    """Adds each row's ratio to the other systems at the same model and workers."""
    by_key = {(r["system"], r["model"], r["workers"]): r for r in rows}
    for row in rows:
        for other in ("keras", "keras_xla", "torch_ddp", "keras_jax"):
            base = by_key.get((other, row["model"], row["workers"]))
            if base is None and other in ONE_PROCESS:
                base = by_key.get((other, row["model"], 1))
            if base is not None and base is not row:
                row[f"x_{other}"] = row["ms_median"] / base["ms_median"]
        for other in ("keras", "torch_ddp"):
            paired = by_key.get((f"{other}_with_{row['system']}", row["model"],
                                 row["workers"]))
            if paired is not None:  # timed in the same processes, alternately
                row[f"x_{other}_same_process"] = float(np.median(
                    [a / b for a, b in zip(row["ms"], paired["ms"])]))
    return rows


def plot(rows, path, title, xlabel="workers (processes on this host)"):
    import matplotlib  # pylint: disable=import-outside-toplevel
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # pylint: disable=import-outside-toplevel

    models = list(dict.fromkeys(r["model"] for r in rows))
    fig, axes = plt.subplots(1, len(models), figsize=(5.2 * len(models), 3.8), squeeze=False)
    for ax, model in zip(axes[0], models):
        mine = [r for r in rows if r["model"] == model and "_with_" not in r["system"]]
        for system in dict.fromkeys(r["system"] for r in mine):
            points = sorted((r["workers"], r["ms_median"]) for r in mine
                            if r["system"] == system)
            xs, ys = zip(*points)
            ax.plot(xs, ys, marker="o", label=system)
        ax.set_xlabel(xlabel)
        ax.set_ylabel("ms per step (median)")
        ax.set_title(model)
        ax.set_xticks(sorted({r["workers"] for r in mine}))
        ax.legend(fontsize=7)
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
