"""The package's layout rules that a reader relies on (issue 53)."""

import collections

from conftest import ROOT

# Every package may have these; `horovod/` mirrors Horovod's module paths
# (`horovod.tensorflow.keras.callbacks`) so that its users' imports work.
SHARED_NAMES = {"__init__.py", "base.py", "options.py"}
MIRRORED = ROOT / "tfdist_ext" / "horovod"


def test_no_two_modules_share_a_basename():
    where = collections.defaultdict(list)
    for path in sorted((ROOT / "tfdist_ext").rglob("*.py")):
        if path.name not in SHARED_NAMES and MIRRORED not in path.parents:
            where[path.name].append(str(path.relative_to(ROOT)))
    shared = {name: paths for name, paths in where.items() if len(paths) > 1}
    assert not shared, f"modules with the same basename (rename one): {shared}"


def test_no_module_is_longer_than_400_lines():
    long = {str(path.relative_to(ROOT)): n
            for path in (ROOT / "tfdist_ext").rglob("*.py")
            if (n := len(path.read_text(encoding="utf-8").splitlines())) > 400}
    assert not long, f"split these modules: {long}"
