"""The elastic seam's layout rules (issue 53): what outside `elastic/` may reach or
name of elastic training."""

import ast
import tokenize

from conftest import ROOT


def test_keras_fit_reaches_elastic_steps_only_through_members_fit():
    """Issue 53, the Keras side of the elastic seam: `fit_hooks` calls one
    `keras.members_fit` object at four points, and no other module imports
    `keras.elastic_steps` (fit_hooks did, with 22 mentions of elastic training)."""
    importers = set()
    for path in sorted((ROOT / "tfdist_ext").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom) and (
                    node.module == "tfdist_ext.keras.elastic_steps" or (
                        node.module == "tfdist_ext.keras"
                        and any(a.name == "elastic_steps" for a in node.names))):
                importers.add(path.relative_to(ROOT / "tfdist_ext").as_posix())
    assert importers == {"keras/members_fit.py"}


def test_the_strategy_and_keras_reach_elastic_training_only_through_the_seam():
    """Issue 53, the strategy side of the elastic seam: `Strategy.membership`
    (`elastic.seam`, fixed or elastic) is what the strategy and Keras call; only
    `elastic/` and Keras' elastic `fit` (members_fit, elastic_steps) read a
    strategy's `elastic` (its `Recovery`) or import `elastic.recovery`. Before:
    strategy.py, strategy_extended.py and four Keras modules read `elastic`."""
    readers = set()
    for path in sorted((ROOT / "tfdist_ext").rglob("*.py")):
        name = path.relative_to(ROOT / "tfdist_ext").as_posix()
        if name.startswith(("elastic/", "launch/")):  # launch/: the CLI's --elastic
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            reads = isinstance(node, ast.Attribute) and node.attr == "elastic"
            imports = isinstance(node, ast.ImportFrom) and (
                node.module == "tfdist_ext.elastic.recovery" or (
                    node.module == "tfdist_ext.elastic"
                    and any(a.name == "recovery" for a in node.names)))
            if reads or imports:
                readers.add(name)
    assert readers == {"keras/members_fit.py", "keras/elastic_steps.py"}


# Outside elastic/, the code (names, not comments or docstrings) that names elastic
# training, and why. Nothing else may.
ELASTIC_NAMED_IN = {
    "strategy.py": "the public argument `elastic=`, its options and building the seam",
    "early.py": "asks the seam how this worker starts (elastic.starting)",
    "keras/members_fit.py": "the Keras side of the seam (ElasticFit)",
    "keras/elastic_steps.py": "the step-level work behind ElasticFit",
    "launch/cli.py": "tfdist-run --elastic",
    "launch/launcher.py": "starting replacements for tfdist-run --elastic",
}


def test_elastic_training_is_named_only_by_the_seam_and_the_launcher():
    """Issue 53: besides `elastic/`, only the modules of ELASTIC_NAMED_IN have an
    identifier containing "elastic". Before: fit_hooks tested `elastic is None` at
    five points, `_compat` read TFDIST_ELASTIC and `strategy_extended` asked
    `_compat.elastic_context()`."""
    named = set()
    for path in sorted((ROOT / "tfdist_ext").rglob("*.py")):
        name = path.relative_to(ROOT / "tfdist_ext").as_posix()
        if name.startswith("elastic/"):
            continue
        with open(path, encoding="utf-8") as source:
            if any(token.type == tokenize.NAME and "elastic" in token.string.lower()
                   for token in tokenize.generate_tokens(source.readline)):
                named.add(name)
    assert named == set(ELASTIC_NAMED_IN)
