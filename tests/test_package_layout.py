"""The package's layout rules that a reader relies on (issue 53)."""

import ast
import collections
import re
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
    ("_compat", "registry", "frontends", "ops", "coordination", "liveness", "cluster", "startup",
     "state"),
    ("collectives", "compression", "bucketing", "ps"),
    ("sync", "cross_device_ops", "reductions", "elastic", "zero"),
    ("strategy", "strategy_config", "strategy_extended", "early"),
    ("keras", "distribution", "horovod"),
)
_SPMD = "the same sequence on every worker (SPMD), so their exchange keys match"
_ZERO = "a sharded optimizer's links to its replicas' parts (zero_stage), weak: they go with it"
# Module-level mutable state (issue 53), "module:name" -> what it is and why it is
# per process; `test_no_module_state_beyond_the_known` says what counts.
KNOWN_STATE = {
    "tfdist_ext._compat:_recoverable_context":
        "[True] once TF's one eager context was configured to take dead workers back",
    "tfdist_ext.collectives.calibration:_BROADCASTS":
        "each cross-device ops' traced broadcast of calibration values, weak: traced once",
    "tfdist_ext.collectives.ucx_engine:_engines":
        "rendezvous name -> UCX engine: TF's deep copies of the cross-device ops share it",
    "tfdist_ext.collectives.ucx_aborts:_aborts":
        "(reason, later) of each abort of the process's UCX collectives (a peer found "
        "dead): a wire-up still waiting for that peer's address stops",
    "tfdist_ext.collectives.ucx_slots:_slots":
        "(key, world size, rank) -> slot handle: functions traced for an earlier "
        "membership run on this process's newest communicators",
    "tfdist_ext.collectives.ucx_slots:_owners":
        "(key, world size, rank) -> the communicator a slot addresses: closing an engine "
        "empties only the slots it still owns",
    "tfdist_ext.distribution:_installed":
        "whether keras.distribution's TF backend was installed into Keras (once a process)",
    "tfdist_ext.distribution.activation:_strategies":
        "replica count -> the Strategy made for a distribution: a multi-worker strategy "
        "can be made once a process",
    "tfdist_ext.elastic.beacon:_answers":
        "strategy key prefix -> its state, answered on the worker's one UDP port",
    "tfdist_ext.elastic.beacon:_socket": "that UDP socket, bound to the worker's port once",
    "tfdist_ext.elastic.beacon:_found":
        "what a replacement heard at import (early.prepare), for the strategies it makes later",
    "tfdist_ext.frontends:_registered":
        "the module name of the front end (Keras') the package root registers at import",
    "tfdist_ext.horovod._collectives:_QuietEagerRun.local":
        "per thread: TF's eager-overhead warning is hidden during our own calls only",
    "tfdist_ext.horovod._runtime:_STATE":
        "hvd.init()'s topology, options and Strategy: Horovod's API is module functions",
    "tfdist_ext.keras.elastic_steps:_progress":
        "model -> its steps done per phase, across membership changes; weak",
    "tfdist_ext.keras.elastic_steps:_functions":
        "model -> its step functions per membership, reused after a change; weak",
    "tfdist_ext.keras.elastic_steps:_callbacks":
        "model -> its running fit's callbacks, whose state an admission hands on; weak",
    "tfdist_ext.keras.fit_callbacks:_kept":
        "strategy -> the callbacks (and their state) fit adds, kept between fits; weak",
    "tfdist_ext.keras.fit_hooks:_fits": "numbers this process's fit calls, " + _SPMD,
    "tfdist_ext.keras.job_profile:_profiled":
        "one profile a process (tfdist-run --profile): the first fit that reaches step A",
    "tfdist_ext.keras.loader_seeds:_installed": "Keras' dataset loaders are wrapped once",
    "tfdist_ext.keras.local_input:_agreements": "numbers the input agreements, " + _SPMD,
    "tfdist_ext.keras.local_input:_chosen":
        "distributed dataset -> the dataset Keras iterates in its place; weak",
    "tfdist_ext.keras.local_input:_last":
        "strategy -> the distributed dataset its Keras epoch iterator read last; weak",
    "tfdist_ext.keras.local_input:_starts":
        "strategy -> batches its next epoch iterator skips (an elastic replacement); weak",
    "tfdist_ext.keras.moved_momentum:_moved":
        "id() of the optimizers whose momentum a running fit moved into the compressor",
    "tfdist_ext.keras.moved_momentum:_logged": "the strategies that logged that move; weak",
    "tfdist_ext.keras.patch_check:_reports":
        "the check of Keras' and TF's patched signatures, made and warned about once",
    "tfdist_ext.keras.patches:_installed": "Keras' classes are patched once a process",
    "tfdist_ext.keras.preemption:_stops": "numbers the preemption stops, " + _SPMD,
    "tfdist_ext.keras.stop_training:_fits": "numbers the fits whose stops it agrees, " + _SPMD,
    "tfdist_ext.keras.saving:_cluster":
        "the first multi-worker strategy and save counts, for the process-wide save wrappers",
    "tfdist_ext.keras.saving:_fitting": "per thread: whether it runs inside fit",
    "tfdist_ext.keras.uneven:_step":
        "per thread: replica threads trace the step concurrently, each with its share",
    "tfdist_ext.keras.worker_callbacks:_ends": "numbers the backup-and-restore ends, " + _SPMD,
    "tfdist_ext.keras.xla:_tracing": "per thread: whether it traces a step for XLA",
    "tfdist_ext.liveness:_watcher":
        "the process's one peer watcher (a thread, heartbeats), shared by its strategies",
    "tfdist_ext.startup:_import_watch":
        "the watch a TF_CONFIG job starts at import, until the first op or a Strategy",
    "tfdist_ext.strategy:Strategy._key_counter":
        "numbers the strategies: each takes its own range of collective keys",
    "tfdist_ext.sync.asynchronous:_sessions": "numbers the async strategies, in creation order",
    "tfdist_ext.sync.momentum:_active":
        "id(SGD) -> the user's momentum and open blocks: nested blocks restore it once",
    **{f"tfdist_ext.zero.shards:{name}": _ZERO
       for name in ("_replicas", "_replica_optimizers", "_slots", "_kinds", "_unshared",
                    "_layouts", "_pending")},
}
# Calls that make a mutable object, by the called name (`collections.deque()` too).
_MUTABLE_CALLS = {"dict", "list", "set", "bytearray", "defaultdict", "OrderedDict",
                  "Counter", "deque", "ChainMap", "local", "WeakKeyDictionary",
                  "WeakValueDictionary", "WeakSet", "count"}


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


def test_no_layer_imports_a_higher_one():
    """The strategy reaches Keras only through `tfdist_ext.frontends` (the package root
    registers Keras' front end), so no import goes up, function-level ones included."""
    rank = {unit: level for level, units in enumerate(LAYERS) for unit in units}
    upward = {(a, b) for a, b in _imports()
              if (a in rank and b in rank and rank[b] > rank[a])
              or (a == "launch" and b in rank and rank[b] > 0)}
    assert upward == set(), "imports against the layers (see LAYERS)"


# getattr / hasattr on a strategy outside the strategy's own modules, "module:attribute"
# -> why it may probe (`frontends.our_strategy` tells ours from TF's).
ALLOWED_PROBES = {
    "tfdist_ext.keras.warmup:num_replicas_in_sync": "any tf.distribute strategy has it",
}


def test_nothing_probes_a_strategy_for_attributes():
    """Issue 53: `keras/` and the layers below recognize a `tfdist_ext.Strategy` with
    `frontends.our_strategy` and then read its attributes, instead of guessing from
    `hasattr(strategy, "sync_runner")`."""
    probes = set()
    for path in (ROOT / "tfdist_ext").rglob("*.py"):
        name = ".".join(path.relative_to(ROOT).with_suffix("").parts)
        if name in ("tfdist_ext.strategy", "tfdist_ext.strategy_extended"):
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if (isinstance(node, ast.Call) and getattr(node.func, "id", "") in ("getattr", "hasattr")
                    and len(node.args) >= 2 and isinstance(node.args[1], ast.Constant)
                    and "strateg" in ast.unparse(node.args[0])):
                probes.add(f"{name}:{node.args[1].value}")
    assert probes == set(ALLOWED_PROBES)


def test_the_cross_device_ops_forward_nothing_to_their_parts():
    """Issue 53: callers name the part (``cross_ops.choice.calibration``), so the
    class has no property that only returns a part's attribute and no attribute
    made by a call at class level (a forwarding descriptor)."""
    tree = ast.parse((ROOT / "tfdist_ext" / "cross_device_ops.py").read_text(encoding="utf-8"))
    parts = {"choice", "wire", "buckets", "engines"}
    cls = next(node for node in tree.body
               if isinstance(node, ast.ClassDef) and node.name == "CrossDeviceOps")
    forwarding = []
    for node in cls.body:
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.Call):
            forwarding.append(ast.unparse(node.targets[0]))
        elif isinstance(node, ast.FunctionDef):
            body = [n for n in node.body if not (isinstance(n, ast.Expr)
                                                  and isinstance(n.value, ast.Constant))]
            if (len(body) == 1 and isinstance(body[0], ast.Return) and body[0].value is not None
                    and re.fullmatch(rf"self\.({'|'.join(parts)})\.\w+(\(.*\))?",
                                     ast.unparse(body[0].value), re.S)):
                forwarding.append(node.name)
    assert forwarding == []


def test_the_cross_device_ops_keep_no_mode_between_calls():
    """Issue 53: what a reduction reduces is an argument (`reductions.Reduction` in its
    options), so CrossDeviceOps has no context manager, and only its construction, a
    membership change and the lazily made state object assign its attributes."""
    tree = ast.parse((ROOT / "tfdist_ext" / "cross_device_ops.py").read_text(encoding="utf-8"))
    cls = next(node for node in tree.body
               if isinstance(node, ast.ClassDef) and node.name == "CrossDeviceOps")
    modal = []
    for method in (n for n in cls.body if isinstance(n, ast.FunctionDef)):
        nodes = list(ast.walk(method))
        if (any(isinstance(n, (ast.Yield, ast.YieldFrom)) for n in nodes)
                or any("contextmanager" in ast.unparse(d) for d in method.decorator_list)):
            modal.append(f"{method.name}: a context manager")
        if method.name not in ("__init__", "_make_parts", "reconfigure", "state"):
            modal += [f"{method.name}: sets {ast.unparse(t)}" for n in nodes
                      if isinstance(n, (ast.Assign, ast.AugAssign))
                      for t in (n.targets if isinstance(n, ast.Assign) else [n.target])
                      if isinstance(t, ast.Attribute) and ast.unparse(t.value) == "self"]
    assert modal == []


def test_nothing_outside_the_cross_device_ops_writes_into_them_or_their_parts():
    """Issue 53: what the strategy decides (dense sparse reductions, a shared
    calibration) reaches the cross-device ops through their constructor, and a measured
    plan through a method of the part (`GradientBuckets.use_plan`): no module but
    cross_device_ops.py and the part's own assigns ``<ops>.densify_sparse`` or
    ``<ops>.<part>.<attribute>`` (lists the five writes there were)."""
    parts = {"choice": "collectives/choice.py", "wire": "collectives/wire_bytes.py",
             "buckets": "bucketing/gradients.py", "engines": "collectives/engines.py"}
    writes = []
    for path in sorted((ROOT / "tfdist_ext").rglob("*.py")):
        name = path.relative_to(ROOT / "tfdist_ext").as_posix()
        if name == "cross_device_ops.py":
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            targets = (node.targets if isinstance(node, ast.Assign) else
                       [node.target] if isinstance(node, (ast.AugAssign, ast.AnnAssign)) else [])
            for target in targets:
                if not isinstance(target, ast.Attribute):
                    continue
                owner = target.value
                if target.attr == "densify_sparse" or (
                        isinstance(owner, ast.Attribute) and owner.attr in parts
                        and parts[owner.attr] != name
                        and ast.unparse(owner.value) != "self"):
                    writes.append(f"{name}:{node.lineno} {ast.unparse(target)}")
    assert writes == []


def test_the_launcher_does_not_import_tensorflow_or_keras():
    code = ("import sys, tfdist_ext.launch.cli, tfdist_ext.launch.launcher; "
            "print(sorted(m for m in ('tensorflow', 'keras') if m in sys.modules))")
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True,
                          text=True, timeout=120, check=True)
    assert done.stdout.strip() == "[]", done.stdout + done.stderr


def _is_mutable(value) -> bool:
    """Whether an assigned value is a mutable container, counter or thread-local."""
    if isinstance(value, (ast.Dict, ast.List, ast.Set, ast.DictComp, ast.ListComp,
                          ast.SetComp)):
        return True
    if isinstance(value, ast.Call):
        func = value.func
        return (func.attr if isinstance(func, ast.Attribute)
                else getattr(func, "id", "")) in _MUTABLE_CALLS
    return False


def _is_registry(name, value) -> bool:
    func = getattr(value, "func", None)
    return (name.endswith("_REGISTRY")
            or (func is not None and (getattr(func, "id", "") == "Registry"
                                      or getattr(func, "attr", "") == "Registry")))


def _module_state(tree):
    """{name} of one module's state (see `test_no_module_state_beyond_the_known`)."""
    found, bound = set(), set()
    scopes = [(node, "") for node in tree.body]
    scopes += [(node, f"{top.name}.") for top in tree.body if isinstance(top, ast.ClassDef)
               for node in top.body]
    for node, prefix in scopes:
        if isinstance(node, (ast.Assign, ast.AnnAssign)) and node.value is not None:
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for name in (t.id for t in targets if isinstance(t, ast.Name)):
                bound.add(prefix + name)
                if (_is_mutable(node.value) and name != "__all__"
                        and not _is_registry(name, node.value)):
                    found.add(prefix + name)
    for node in ast.walk(tree):
        if isinstance(node, ast.Global):
            found.update(node.names)
        targets = (node.targets if isinstance(node, ast.Assign)
                   else [node.target] if isinstance(node, (ast.AugAssign, ast.AnnAssign))
                   else [])
        found.update(t.value.id for t in targets
                     if isinstance(t, ast.Attribute) and isinstance(t.value, ast.Name)
                     and t.value.id in bound)
    return found


def test_no_module_state_beyond_the_known():
    """Module-level mutable state is listed in KNOWN_STATE, each with its reason.

    State is, in any tfdist_ext module: a module-level (or top-level class-level)
    name bound to a dict, list or set literal or comprehension, or to a call of
    `dict`, `list`, `set`, `bytearray`, `collections.*`, `threading.local`,
    `weakref.Weak*` or `itertools.count`; a name a function declares `global`;
    and a module-level object whose attributes a function assigns
    (``_STATE.strategy = ...``). Allowed by rule, so not listed: registries (a
    `registry.Registry` instance, or a name ending in ``_REGISTRY``), `__all__`,
    and immutable constants (tuples, frozensets, strings, numbers,
    `types.MappingProxyType`), loggers, compiled patterns and locks (a lock
    holds no data; the state it guards is listed).
    """
    state = set()
    for path in (ROOT / "tfdist_ext").rglob("*.py"):
        module = ".".join(path.relative_to(ROOT).with_suffix("").parts)
        module = module.removesuffix(".__init__")
        tree = ast.parse(path.read_text(encoding="utf-8"))
        state.update(f"{module}:{name}" for name in _module_state(tree))
    assert sorted(state - set(KNOWN_STATE)) == [], (
        "new module state: make it per object, or list it in KNOWN_STATE with a reason")
    assert sorted(set(KNOWN_STATE) - state) == [], "gone: strike them from KNOWN_STATE"
