"""The documentation holds together: a short front page, links that resolve, no orphans.

Fast and without TensorFlow: reads README.md and docs/ only.

* README.md stays a front page (at most `README_MAX_LINES` lines);
* every relative Markdown link in README.md and docs/**/*.md points to an existing
  file, and a `#anchor` into a .md file to one of its headings (GitHub's slugs);
* every docs/ page is reachable from README.md by following links;
* docs/results/README.md names every file in docs/results/;
* every docs/....md#anchor that tfdist_ext/ quotes (warnings, docstrings) resolves too.
"""

import collections
import pathlib
import re
import urllib.parse

ROOT = pathlib.Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
DOCS = ROOT / "docs"
PACKAGE = ROOT / "tfdist_ext"
RESULTS = DOCS / "results"
README_MAX_LINES = 260

FENCE = re.compile(r"^(\s*)(```+|~~~+)")
INLINE_CODE = re.compile(r"(`+)(?:(?!\1).)+?\1")
# [text](target "title") and ![alt](target); the text may hold one level of brackets.
INLINE_LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\[\]]*\])*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
REFERENCE_DEF = re.compile(r"^\s{0,3}\[[^\]]+\]:\s*<?(\S+?)>?(?:\s+.*)?$")
HEADING = re.compile(r"^\s{0,3}(#{1,6})\s+(.*?)\s*#*\s*$")
EXTERNAL = re.compile(r"^[a-zA-Z][a-zA-Z0-9+.-]*:")  # http:, https:, mailto:, ...
QUOTED_DOC = re.compile(r"\b((?:docs/[\w./-]+|README)\.md)(?:#([\w-]+))?")


def _prose_lines(text, blank_code=True):
    """(line number, line) outside fenced code blocks, inline code blanked if asked."""
    fence = None
    for number, line in enumerate(text.splitlines(), 1):
        match = FENCE.match(line)
        if match:
            marker = match.group(2)[0] * 3
            if fence is None:
                fence = marker
                continue
            if match.group(2).startswith(fence):
                fence = None
                continue
        if fence is not None:
            continue
        yield number, (INLINE_CODE.sub(lambda m: " " * len(m.group(0)), line) if blank_code
                       else line)


def _links(path):
    """(line number, target) of every link in a Markdown file."""
    for number, line in _prose_lines(path.read_text(encoding="utf-8")):
        for match in INLINE_LINK.finditer(line):
            yield number, match.group(1)
        match = REFERENCE_DEF.match(line)
        if match:
            yield number, match.group(1)


def _slug(heading):
    """GitHub's anchor for a heading: markup removed, lowercase, spaces to '-', and
    punctuation other than '-' and '_' dropped."""
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # links keep their text
    text = re.sub(r"<[^>]+>", "", text)  # inline HTML
    text = text.replace("`", "").strip().lower()
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def _anchors(path):
    """Every heading anchor of a Markdown file, with GitHub's -1, -2 for repeats."""
    seen = collections.Counter()
    anchors = set()
    for _, line in _prose_lines(path.read_text(encoding="utf-8"), blank_code=False):
        match = HEADING.match(line)
        if not match:
            continue
        slug = _slug(match.group(2))
        anchors.add(slug if not seen[slug] else f"{slug}-{seen[slug]}")
        seen[slug] += 1
    return anchors


def _pages():
    return [README] + sorted(DOCS.rglob("*.md"))


def _resolve(page, target):
    """(file or None, anchor or None) that a relative link from `page` points to."""
    target, _, anchor = target.partition("#")
    target = urllib.parse.unquote(target)
    if not target:
        return page, anchor or None
    if target.startswith("/"):
        return ROOT / target.lstrip("/"), anchor or None
    return (page.parent / target).resolve(), anchor or None


def _rel(path):
    return path.relative_to(ROOT).as_posix() if path.is_relative_to(ROOT) else str(path)


def test_readme_is_a_front_page():
    lines = README.read_text(encoding="utf-8").count("\n")
    assert lines <= README_MAX_LINES, (
        f"README.md has {lines} lines (at most {README_MAX_LINES}): it is the front page; "
        "move details into docs/ and link to them")


def test_every_relative_link_resolves():
    offenders = []
    anchors = {}
    for page in _pages():
        for number, target in _links(page):
            if EXTERNAL.match(target):
                continue
            path, anchor = _resolve(page, target)
            where = f"{_rel(page)}:{number}: ({target})"
            if not path.exists():
                offenders.append(f"{where}: no such file {_rel(path)}")
                continue
            if anchor and path.suffix == ".md":
                if path not in anchors:
                    anchors[path] = _anchors(path)
                if anchor.lower() not in anchors[path]:
                    offenders.append(f"{where}: no heading with anchor #{anchor} in "
                                     f"{_rel(path)}")
    assert not offenders, ("broken links (paths are relative to the linking page; anchors "
                           "are GitHub heading slugs):\n  " + "\n  ".join(offenders))


def test_every_docs_page_is_reachable_from_the_readme():
    reached, todo = {README}, [README]
    while todo:
        page = todo.pop()
        for _, target in _links(page):
            if EXTERNAL.match(target):
                continue
            path, _ = _resolve(page, target)
            if path.suffix == ".md" and path.is_file() and path not in reached:
                reached.add(path)
                todo.append(path)
    orphans = [_rel(p) for p in sorted(DOCS.rglob("*.md")) if p.resolve() not in reached]
    assert not orphans, ("docs pages no link chain from README.md reaches; link them from "
                         "a page that is reached:\n  " + "\n  ".join(orphans))


def test_results_index_names_every_results_file():
    index = RESULTS / "README.md"
    assert index.is_file(), "docs/results/README.md (the index of docs/results/) is missing"
    text = index.read_text(encoding="utf-8")
    names = {token.rstrip(".") for token in re.findall(r"[\w.\-/]+", text)}
    missing = [p.relative_to(RESULTS).as_posix() for p in sorted(RESULTS.rglob("*"))
               if p.is_file() and p != index
               and p.relative_to(RESULTS).as_posix() not in names]
    assert not missing, ("docs/results/README.md does not name these files of docs/results/ "
                         "(add one line each: what it is and the command that wrote it):\n  "
                         + "\n  ".join(missing))


def test_docs_the_package_quotes_resolve():
    """Warnings and docstrings point to docs (e.g. the measured costs behind a warning in
    docs/results.md#...): each quoted page exists and has the quoted heading."""
    offenders = []
    anchors = {}
    for source in sorted(PACKAGE.rglob("*.py")):
        text = source.read_text(encoding="utf-8")
        for number, line in enumerate(text.splitlines(), 1):
            for match in QUOTED_DOC.finditer(line):
                path, anchor = ROOT / match.group(1), match.group(2)
                where = f"{_rel(source)}:{number}: {match.group(0)}"
                if not path.is_file():
                    offenders.append(f"{where}: no such file")
                    continue
                if anchor:
                    if path not in anchors:
                        anchors[path] = _anchors(path)
                    if anchor.lower() not in anchors[path]:
                        offenders.append(f"{where}: no heading with that anchor")
    assert not offenders, ("docs quoted in tfdist_ext/ that do not resolve (paths are "
                           "relative to the repository root):\n  " + "\n  ".join(offenders))
