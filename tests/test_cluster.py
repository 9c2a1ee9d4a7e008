import json

import pytest

from tfdist_ext.cluster import parse_tf_config

CLUSTER = {"worker": ["127.0.0.1:1000", "127.0.0.1:1001"]}


def test_valid_config():
    spec = parse_tf_config(json.dumps({"cluster": CLUSTER, "task": {"type": "worker", "index": 1}}))
    assert spec.num_workers == 2 and spec.task_index == 1 and spec.task_type == "worker"


@pytest.mark.parametrize("raw", [None, "", "  ", '{"task": {}}', "{}"])
def test_absent_config_means_local(raw):
    assert parse_tf_config(raw) is None


@pytest.mark.parametrize("raw, message", [
    ('{"cluster": ', r"TF_CONFIG is invalid: it is not valid JSON"),
    ('[1, 2]', r"the top level must be a JSON object"),
    (json.dumps({"cluster": CLUSTER}), r'"task" with "type" and "index" is missing'),
    (json.dumps({"cluster": CLUSTER, "task": {"type": "worker"}}), r'"task" with "type" and "index" is missing'),
    (json.dumps({"cluster": CLUSTER, "task": {"type": "worker", "index": 2}}),
     r"task index 2 is out of range for job 'worker' with 2 task\(s\) \(allowed: 0..1\)"),
    (json.dumps({"cluster": CLUSTER, "task": {"type": "worker", "index": -1}}), r"task index -1 is out of range"),
    (json.dumps({"cluster": CLUSTER, "task": {"type": "ps", "index": 0}}), r"task type 'ps' is not a job"),
    (json.dumps({"cluster": {"worker": ["nohostport"]}, "task": {"type": "worker", "index": 0}}),
     r'"cluster" must map job names to lists of "host:port" strings'),
    (json.dumps({"cluster": {"ps": ["a:1"]}, "task": {"type": "ps", "index": 0}}), r'no "worker" or "chief" job'),
    (json.dumps({"task": {"type": "worker", "index": 0}}), r'"task" is given but "cluster" is missing'),
])
def test_malformed_config_names_the_problem_and_the_fix(raw, message):
    with pytest.raises(ValueError, match=message) as info:
        parse_tf_config(raw)
    assert "Received:" in str(info.value) and "tfdist-run -np N" in str(info.value)
