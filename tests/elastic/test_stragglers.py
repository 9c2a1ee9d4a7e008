"""The straggler check (`tfdist_ext.elastic.stragglers`) on its own, in one process;
the removal of a straggler from a running job is in test_elastic_departures.py."""

import numpy as np
import pytest

from tfdist_ext.elastic import Elastic, stragglers


@pytest.mark.parametrize("seconds, members, found", [
    ({0: 0.01, 1: 0.011, 2: 0.05}, [0, 1, 2], 2),  # 4.8x the others' median
    ({0: 0.01, 1: 0.011, 2: 0.029}, [0, 1, 2], None),  # 2.8x: under the factor
    ({0: 0.03, 1: 0.01}, [0, 1], 0),  # two members: the other one is the median
    ({0: 0.03}, [0], None),  # alone: nobody to compare with
    ({0: 0.01, 1: 0.01, 2: 0.09, 3: 0.01}, [0, 1, 3], None),  # 2 is no member
    ({0: 0.0, 1: 0.0}, [0, 1], None),  # nothing measured
])
def test_the_slowest_member_against_the_median_of_the_others(seconds, members, found):
    assert stragglers.slow(seconds, members, 3.0) == found


def _step(monitor, row, steps, members=(0, 1, 2)):
    monitor.table.assign(np.asarray(row, np.float32))
    return monitor.step_ended(1.0e9 + steps, steps, members)


def test_only_k_slow_steps_in_a_row_make_a_straggler():
    monitor = stragglers.Monitor(me=1, workers=3, factor=3.0, steps=4)
    slow, even = [0.01, 0.01, 0.05], [0.01, 0.01, 0.01]
    found = [_step(monitor, row, i + 1) for i, row in enumerate(
        [slow, slow, slow, even, slow, slow, slow, slow])]
    assert found == [None] * 7 + [2]
    (removed,) = monitor.removed
    assert removed["worker"] == 2 and removed["step"] == 8
    assert removed["seconds"] == [pytest.approx(0.05)] * 4
    assert removed["others"] == [pytest.approx(0.01)] * 4
    assert monitor.ended.numpy() == pytest.approx(1.0e9 + 8)
    assert not monitor.leaving  # worker 1 only reports it


def test_a_membership_change_starts_the_count_again():
    monitor = stragglers.Monitor(me=0, workers=3, factor=3.0, steps=3)
    slow = [0.01, 0.01, 0.05]
    assert [_step(monitor, slow, i) for i in (1, 2)] == [None, None]
    monitor.reset()
    assert [_step(monitor, slow, i) for i in (3, 4, 5)] == [None, None, 2]
    # After a change the table of the first step is all zero: it does not count.
    assert _step(monitor, [0, 0, 0], 6) is None


@pytest.mark.parametrize("options, message", [
    ({"straggler_factor": 1}, "`straggler_factor` of Elastic must be None (off) or a finite "
                              "number > 1, e.g. 3; received 1."),
    ({"straggler_factor": "3"}, "received '3'"),
    ({"straggler_factor": float("nan")}, "received nan"),
    ({"straggler_steps": 0}, "`straggler_steps` of Elastic must be an integer >= 1; "
                             "received 0."),
    ({"straggler_steps": 2.5}, "received 2.5"),
])
def test_bad_straggler_options_name_the_option_and_the_value(options, message):
    with pytest.raises(ValueError) as info:
        Elastic(**options)
    assert message in str(info.value)


def test_off_by_default():
    assert Elastic().straggler_factor is None
