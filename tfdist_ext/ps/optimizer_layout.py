"""Where a worker's optimizer state lives on the parameter servers (`sync="async"`).

Each server applies gradients to its variables with its own copy of the
model's optimizer; a worker checkpoints and restores the servers' optimizer
state through its own optimizer's variables, matched here by path.
"""

from tfdist_ext import _compat


def layout(model, shards, config):
    """Per server: (this worker's optimizer variable, owner) in the server's optimizer order.

    A server builds the optimizer of Keras config `config` (the model's, maybe
    with compensated momentum) over its variables; an optimizer built the same
    way over the same model variables here lists its variables in that order,
    with the paths of the worker's own optimizer variables (a compensated
    momentum of 0 has no momentum slots: the worker's stay as they are).
    Variables every server has (iterations, learning rate) are owned by the
    first server that lists them.
    """
    import keras  # pylint: disable=import-outside-toplevel

    optimizer = model.optimizer
    if not optimizer.built:
        optimizer.build(model.trainable_variables)
    by_path = {v.path: v for v in optimizer.variables}
    layout, owned = [], set()
    with _compat.init_scope():
        for members in shards:
            twin = keras.optimizers.deserialize(config)
            twin.build([model.trainable_variables[j] for j in members])
            entries = []
            for v in twin.variables:
                if v.path not in by_path:
                    raise ValueError(
                        f"sync='async' cannot map the optimizer variable {v.path} of "
                        f"{type(optimizer).__name__} to the model's optimizer; its state "
                        "could not be checkpointed. Use a Keras built-in optimizer.")
                entries.append((by_path[v.path], v.path not in owned))
                owned.add(v.path)
            layout.append(entries)
    return layout
