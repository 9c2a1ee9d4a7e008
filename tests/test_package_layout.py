"""The package's layout rules that a reader relies on (issue 53)."""

import ast
import collections
import subprocess
import sys

from conftest import ROOT

# Every package may have these; `horovod/` mirrors Horovod's module paths
# (`horovod.tensorflow.keras.callbacks`) so that its users' imports work.
SHARED_NAMES = {"__init__.py", "base.py", "options.py"}
MIRRORED = ROOT / "tfdist_ext" / "horovod"

# The package's layers, lowest first (docs/architecture.md): a module may import
# its own layer and those below. `launch` stands beside them (no TensorFlow).
LAYERS = (
    ("_compat", "registry", "ops", "coordination", "liveness", "cluster", "startup", "state"),
    ("collectives", "compression", "bucketing", "ps"),
    ("sync", "cross_device_ops", "elastic", "zero"),
    ("strategy", "strategy_config", "strategy_extended", "early"),
    ("keras", "distribution", "horovod"),
)
# Imports against the layers that exist today (issue 53 removes them); a new
# one fails, and so does one that is gone until it is struck from this list.
KNOWN_UPWARD = {
    ("strategy", "keras"): "Strategy installs the Keras patches and makes the fit callbacks",
    ("early", "keras"): "a TF_CONFIG job's import-time set-up seeds Keras' data loaders",
    ("launch", "early"): "the launcher releases an early TF_CONFIG set-up of its own",
    ("launch", "elastic"): "the launcher reads the elastic environment variable and delay",
}


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


def _unit(module):
    """The layer unit of a `tfdist_ext.x.y` module name: `x`."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


def _imports():
    """{(importing unit, imported unit)} over every tfdist_ext module, function-level too."""
    edges = set()
    for path in (ROOT / "tfdist_ext").rglob("*.py"):
        name = ".".join(path.relative_to(ROOT).with_suffix("").parts)
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("tfdist_ext"):
                targets = ([f"tfdist_ext.{a.name}" for a in node.names]
                           if node.module == "tfdist_ext" else [node.module])
            elif isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif (isinstance(node, ast.Call) and getattr(node.func, "attr", "") == "import_module"
                  and node.args and isinstance(node.args[0], ast.Constant)):
                targets = [str(node.args[0].value)]
            else:
                continue
            edges.update((_unit(name), _unit(t)) for t in targets
                         if t.startswith("tfdist_ext.") and _unit(t) != _unit(name))
    return edges


def test_no_layer_imports_a_higher_one_beyond_the_known_debt():
    rank = {unit: level for level, units in enumerate(LAYERS) for unit in units}
    upward = {(a, b) for a, b in _imports()
              if (a in rank and b in rank and rank[b] > rank[a])
              or (a == "launch" and b in rank and rank[b] > 0)}
    assert upward - set(KNOWN_UPWARD) == set(), "imports against the layers (see LAYERS)"
    assert set(KNOWN_UPWARD) - upward == set(), "gone: strike them from KNOWN_UPWARD"


def test_the_launcher_does_not_import_tensorflow_or_keras():
    code = ("import sys, tfdist_ext.launch.cli, tfdist_ext.launch.launcher; "
            "print(sorted(m for m in ('tensorflow', 'keras') if m in sys.modules))")
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True,
                          text=True, timeout=120, check=True)
    assert done.stdout.strip() == "[]", done.stdout + done.stderr
