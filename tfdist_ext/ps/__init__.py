"""Parameter servers for asynchronous training (`Strategy(sync="async")`).

* `wire`: message kinds, tags and the mailbox calls over UCX (the
  `TfdistPs*` ops of `custom_ops/ucx/kernels/mailbox_ops.cc`);
* `sharding`: which server holds which variable (pure);
* `optimizer_layout`: which of a worker's optimizer variables each server's
  optimizer state maps to;
* `admission`: which pushed gradient a server may apply next under a
  staleness bound (pure);
* `server`: the serving loop a "ps" task runs;
* `roles`: whether this process serves (a "ps" task) or trains.

The worker side is `tfdist_ext.sync.asynchronous`.
"""
