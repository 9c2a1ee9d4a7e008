"""Keras as the strategy's front end (`tfdist_ext.frontends.FrontEnd`).

`tfdist_ext.Strategy` calls these through `tfdist_ext.frontends`, so that the strategy
does not import this package; the package root registers this module. Each function
imports what it uses: `prepare_workers` runs while `import tfdist_ext` is still under
way, before the rest of the package may be imported.
"""


def attach(strategy):
    """Installs Keras' patches (once a process; `patches.install`) and the SIGTERM
    handler that stops `fit` at a step boundary; returns that handler."""
    from tfdist_ext.keras import patches, preemption  # pylint: disable=import-outside-toplevel

    patches.install(strategy)
    # After TF's coordination service, whose own SIGTERM handler this replaces.
    handler = preemption.Preemption(strategy.extended.worker_devices[0])
    handler.install_handler()
    return handler


def fit_callbacks(strategy):
    """The callbacks `fit` adds first (installed by `tfdist_ext.keras.fit_hooks`)."""
    from tfdist_ext.keras import fit_callbacks as kept  # pylint: disable=import-outside-toplevel

    return kept.fit_callbacks(strategy)


def compression_decisions(strategy):
    """The adaptive compression controller's decision rounds so far (a list of dicts)."""
    from tfdist_ext.keras import fit_callbacks as kept  # pylint: disable=import-outside-toplevel

    controller = kept.kept(strategy).get("adaptive")
    return list(controller.decisions) if controller else []


def prepare_workers(worker_addresses):
    """Seeds Keras' dataset loaders alike on every worker (`loader_seeds.install`)."""
    from tfdist_ext.keras import loader_seeds  # pylint: disable=import-outside-toplevel

    loader_seeds.install(worker_addresses)
