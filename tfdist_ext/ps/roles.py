"""What a process does when TF_CONFIG has a "ps" job: serve, or train without it."""

import sys


def serve_or_resolver(spec, sync_policy):
    """Serves and exits on a "ps" task; elsewhere the workers' cluster resolver.

    Args:
        spec: The `tfdist_ext.cluster` spec from TF_CONFIG, or None.
        sync_policy: The strategy's sync policy; only policies with
            `uses_parameter_servers` accept a "ps" job.

    Returns:
        None when there is no "ps" job (TF_CONFIG's own resolver applies),
        else a resolver of the cluster without the servers: TF's collectives
        and coordination service must not wait for them.

    Raises:
        ValueError: A "ps" job with a policy that does not use servers.
    """
    if spec is None or "ps" not in spec.jobs:
        return None
    if not getattr(sync_policy, "uses_parameter_servers", False):
        raise ValueError(
            f"TF_CONFIG has a 'ps' job ({len(spec.jobs['ps'])} task(s)), which only "
            f"sync='async' uses; this strategy has sync={sync_policy.name!r}. Pass "
            "sync='async', or launch without parameter servers (drop `--ps`, or the "
            "'ps' job from TF_CONFIG).")
    if spec.task_type == "ps":
        from tfdist_ext.ps import server  # pylint: disable=import-outside-toplevel
        sys.exit(server.serve(spec, sync_policy.timeout_seconds))
    return spec.without_servers().resolver()
