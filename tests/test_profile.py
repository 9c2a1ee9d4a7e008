"""Profiles of a multi-worker fit show tfdist_ext's collectives (TensorBoard's Profile tab).

Keras' TensorBoard(profile_batch=...) profiles the chief; `tfdist-run --profile DIR
--profile-steps A-B` every worker, into one session of DIR. The written XSpace
protobufs (what xprof reads) are parsed with TensorFlow's own proto classes.
"""

import collections
import pathlib
import re
import sys

import pytest

from conftest import ROOT, launch, read_worker_json
from tfdist_ext.launch import cli

CHECKS = ROOT / "tests" / "workers" / "profile_checks.py"
COLLECTIVE = re.compile(r"^tfdist/ring/[a-z0-9_]+")


def collective_events(path):
    """{event name: [duration in microseconds]} of the tfdist/... events in `path`."""
    from tensorflow.tsl.profiler.protobuf import xplane_pb2  # pylint: disable=import-outside-toplevel
    space = xplane_pb2.XSpace()
    space.ParseFromString(pathlib.Path(path).read_bytes())
    found = collections.defaultdict(list)
    for plane in space.planes:
        for line in plane.lines:
            for event in line.events:
                name = plane.event_metadata[event.metadata_id].name
                if COLLECTIVE.match(name):
                    found[name].append(event.duration_ps / 1e6)
    return found


@pytest.mark.multiworker
def test_every_workers_profile_shows_the_collectives(tmp_path):
    code, out, _ = launch(2, [CHECKS, tmp_path],
                          options=["--profile", tmp_path / "job", "--profile-steps", "6-8"])
    assert code == 0, out[-4000:]
    assert len(read_worker_json(tmp_path, 2)) == 2
    sessions = list((tmp_path / "job" / "plugins" / "profile").iterdir())
    assert len(sessions) == 1, sessions  # one session, a host per worker
    hosts = sorted(p.name for p in sessions[0].glob("*.xplane.pb"))
    assert hosts == ["worker0.xplane.pb", "worker1.xplane.pb"]
    for host in hosts:
        events = collective_events(sessions[0] / host)
        durations = [d for spans in events.values() for d in spans]
        assert len(durations) >= 3 and all(d > 0 for d in durations), (host, dict(events))
    chief = list((tmp_path / "tb").rglob("*.xplane.pb"))  # Keras' TensorBoard callback
    assert chief and collective_events(chief[0]), chief


@pytest.mark.parametrize("argv, message", [
    (["--profile-steps", "3-1"], "--profile-steps='3-1' must be two step numbers A-B with "
                                 "0 <= A <= B"),
    (["--profile-steps", "2-4"], "argument --profile-steps: needs --profile DIR"),
])
def test_bad_profile_options_are_named(argv, message, capsys):
    with pytest.raises(SystemExit):
        cli.main(["-np", "2", *argv, sys.executable, "-c", "pass"])
    assert message in capsys.readouterr().err


def test_a_bad_profile_steps_variable_is_named():
    from tfdist_ext.keras import job_profile  # pylint: disable=import-outside-toplevel
    with pytest.raises(ValueError, match=r"TFDIST_PROFILE_STEPS='ten' must be two step "
                                         r"numbers A-B with 0 <= A <= B"):
        job_profile.from_env(None, {"TFDIST_PROFILE_DIR": "x", "TFDIST_PROFILE_STEPS": "ten"})
    assert job_profile.from_env(None, {}) is None
