"""The current compression path reproduces the fixed-seed record bit for bit.

tests/compression/golden.json was written by tests/compression/golden.py with
the code before reduction hooks (the commit that added it): for every
compressor and a few option / algorithm / bucketing variants, the digests of
every replica's reduced gradients at every step and of the residuals, and the
byte counters. A change that alters a single bit or byte count fails here.
"""

import json
import pathlib

import pytest

from tests.compression import golden

RECORD = pathlib.Path(__file__).parent / "golden.json"


@pytest.fixture(scope="module")
def record():
    return json.loads(RECORD.read_text(encoding="utf-8"))


def test_every_recorded_scenario_still_runs(record):
    assert set(record) <= set(golden.scenarios())


@pytest.mark.parametrize("scenario", sorted(golden.scenarios()))
def test_bit_identical_to_record(scenario, record):
    if scenario not in record:
        pytest.skip(f"{scenario!r} is newer than the record")
    got = {key: golden.digest(value)
           for key, value in golden.run(golden.scenarios()[scenario]).items()}
    assert got == record[scenario]
