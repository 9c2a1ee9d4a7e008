"""CPU caps of the benchmarks' test bed (`tfdist_ext.launch.cpucap`): real cgroups."""

import os
import subprocess
import sys
import time

import pytest

from tfdist_ext.launch import cpucap

BUSY = "import time\nt = time.time()\nwhile time.time() - t < 1.5: pass\n"


def _can_cap():
    try:
        cpucap.CpuCaps(f"probe-{os.getpid()}", 0.5).close()
        return True
    except cpucap.CpuCapError:
        return False


@pytest.mark.skipif(os.geteuid() != 0 or not _can_cap(), reason="needs root and cgroups")
def test_a_capped_process_gets_its_share_and_the_group_is_removed():
    with cpucap.CpuCaps(f"test-{os.getpid()}", 0.25) as caps:
        child = subprocess.Popen([sys.executable, "-c", BUSY])
        caps.add(0, child.pid)
        start = os.times()
        child.wait()
        end = os.times()
        used = (end.children_user + end.children_system) - (start.children_user
                                                           + start.children_system)
        assert caps.throttled(0) > 10
        folder = caps.folder
    # 1.5 s busy under a quarter core: well under the 1.5 s it would use alone.
    assert used < 0.9, used
    assert not folder.exists()


@pytest.mark.parametrize("kwargs, message", [
    ({"cpus": 0}, "cpus_per_worker=0: must be a number of cores > 0, e.g. 0.5"),
    ({"cpus": "half"}, "cpus_per_worker='half': must be a number of cores > 0"),
    ({"cpus": 0.5, "period_us": 10}, "period_us=10: must be in [1000, 1000000]"),
])
def test_bad_caps_are_refused_naming_the_value(kwargs, message):
    with pytest.raises(ValueError) as info:
        cpucap.CpuCaps("bad", **kwargs)
    assert message in str(info.value)


@pytest.mark.skipif(os.geteuid() == 0, reason="runs as root")
def test_without_root_the_error_says_what_to_do():
    with pytest.raises(cpucap.CpuCapError, match="needs root .* leave out --cpus-per-worker"):
        cpucap.CpuCaps("user", 0.5)


def test_a_leftover_process_is_moved_out_before_the_group_goes():
    if os.geteuid() != 0 or not _can_cap():
        pytest.skip("needs root and cgroups")
    caps = cpucap.CpuCaps(f"leftover-{os.getpid()}", 0.5)
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        caps.add(1, sleeper.pid)
        time.sleep(0.1)
        caps.close()
        assert not caps.folder.exists() and sleeper.poll() is None
    finally:
        sleeper.kill()
        sleeper.wait()


def test_the_groups_of_a_job_whose_process_ended_are_removed():
    if os.geteuid() != 0 or not _can_cap():
        pytest.skip("needs root and cgroups")
    ended = subprocess.Popen([sys.executable, "-c", "pass"])
    ended.wait()
    alive = os.getpid()
    stale = cpucap.CpuCaps(f"stale-{ended.pid}-1", 0.5)
    stale.group(0)
    kept = cpucap.CpuCaps(f"stale-{alive}-2", 0.5)
    kept.group(0)
    try:
        assert cpucap.CpuCaps.remove_leftovers("stale") == [stale.folder]
        assert not stale.folder.exists() and kept.folder.exists()
    finally:
        kept.close()
        if stale.folder.exists():
            stale.close()
