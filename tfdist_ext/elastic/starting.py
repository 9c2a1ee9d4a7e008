"""The elastic seam at a worker's start, before TF's context exists.

`tfdist_ext.early` asks `at_import(spec)` how to configure TF for this worker
and knows nothing else of elastic training: under TFDIST_ELASTIC=1 (what
`tfdist-run --elastic` sets) the job is recoverable (a death does not fail the
others' TF agents), and a worker started again while its job runs joins as a
replacement, without TF's coordination service, whose leader may be the worker
it replaces. The members answer its query (`beacon`); what it found is kept
for `joining`.
"""

import dataclasses
import logging
import os

from tfdist_ext.elastic import beacon
from tfdist_ext.elastic import options as options_lib

log = logging.getLogger("tfdist_ext")


@dataclasses.dataclass(frozen=True)
class Start:
    """How this worker process starts TF.

    Attributes:
        recoverable: The job outlives a worker's death and takes a worker
            started again (`_compat.prepare_multi_worker_context`).
        joining: This worker was started again while its job runs: it starts
            TF without the coordination service and asks to be taken in.
    """

    recoverable: bool = False
    joining: bool = False


def at_import(spec, environ=os.environ) -> Start:
    """How the worker of `spec` (a `cluster.ClusterSpec`) starts, asking the
    other workers' beacons whether their job is running when it is elastic."""
    if environ.get(options_lib.VARIABLE) != "1":
        return Start()
    if spec.task_type != "worker":
        return Start(recoverable=True)
    others = [a for i, a in enumerate(spec.jobs["worker"]) if i != spec.task_index]
    answer = beacon.running_job(others)
    if answer is None:
        return Start(recoverable=True)
    beacon.remember(answer)
    log.warning("tfdist_ext: worker %d starts while its job runs: it joins as a replacement.",
                spec.task_index)
    return Start(recoverable=True, joining=True)


def in_the_job(environ=os.environ):
    """Tells `tfdist-run --elastic`, if it started this worker again, that the worker is
    in the job now (admitted, or, when no member answered at its start, once it met
    every other worker at the job's start, `joining.stores_at_start`): it creates the
    file `options.MEMBER_FILE` names. The launcher stops the replacements that are not
    in the job when the last worker in it fails."""
    path = environ.get(options_lib.MEMBER_FILE)
    if path:
        try:
            with open(path, "w", encoding="utf-8"):
                pass
        except OSError as err:  # the launcher's folder is gone: it is ending the job
            log.warning("tfdist_ext: could not tell tfdist-run this worker joined (%s).", err)


def startup_hint(environ=os.environ) -> str:
    """What `tfdist_ext.startup` adds to its timeout message in an elastic job
    when every peer's port answers: the likelier cause is a worker started
    again whose query no member answered, so that it tried to join TF's
    coordination service, which refuses a second incarnation of a task it
    still counts as alive."""
    if environ.get(options_lib.VARIABLE) != "1":
        return ""
    return ("In elastic training this is also how a worker started again while its job "
            "runs ends when no member answered its query on UDP at their TF_CONFIG ports "
            "(`tfdist_ext.elastic.beacon`): let UDP through on those ports.")
