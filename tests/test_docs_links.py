"""Every relative link and anchor in the documentation resolves.

The pages checked are ``README.md``, ``docs/*.md`` and ``bench/README.md``. A link is an inline
link or image (``[text](target)``, ``![alt](target)``), a reference definition
(``[name]: target``) or an HTML ``href``/``src`` attribute, outside fenced code blocks and
inline code. Links with a scheme (``https:``, ``mailto:``) are not followed. For the others:

* the path, relative to the page's folder (or to the repository root when it starts with
  ``/``), must name a file or folder of the repository;
* an anchor (``#...``) on a Markdown page must be the slug of one of its headings, made as
  GitHub makes it: the heading's text without its Markdown (code spans keep their text, links
  their label), lower case, every character but letters, digits, spaces, ``-`` and ``_``
  dropped, spaces turned into ``-``; a heading whose slug came before gets ``-1``, ``-2``, ...

The benchmark charts are the one exception. ``docs/images/throughput.svg``, ``latency.svg``
and ``floors.svg`` are drawn from the bench's results by ``make charts`` and committed; the
pages show them as images. While the Makefile has no ``charts`` target (the charts arrive
with it), a link to one of exactly those three files may point at nothing yet; once it has
one, they are checked like any other file, so the exception ends by itself.
"""

from __future__ import annotations

import importlib
import re
import unicodedata
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

# What `make charts` writes (see the module's docstring).
CHART_OUTPUTS = frozenset(f"docs/images/{name}.svg" for name in ("throughput", "latency", "floors"))


def pages() -> list[Path]:
    return [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")), ROOT / "bench/README.md"]


FENCE = re.compile(r"^ {0,3}(`{3,}|~{3,})")
HEADING = re.compile(r"^ {0,3}(#{1,6})[ \t]+(.*?)[ \t]*#*[ \t]*$")
INLINE_LINK = re.compile(
    r"!?\[(?:[^\[\]]|\[[^\]]*\])*\]\(\s*<?([^()\s>]*)>?(?:\s+\"[^\"]*\")?\s*\)"
)
REFERENCE = re.compile(r"^ {0,3}\[[^\]]+\]:\s*<?(\S+?)>?(?:\s.*)?$")
HTML_ATTR = re.compile(r"""\b(?:href|src)\s*=\s*["']([^"']*)["']""")
CODE_SPAN = re.compile(r"(`+)(.+?)\1", re.S)
SCHEME = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*:")


def prose_lines(text: str) -> Iterator[tuple[int, str]]:
    """The page's lines outside fenced code blocks, numbered from 1."""
    fence: str | None = None
    for number, line in enumerate(text.splitlines(), 1):
        m = FENCE.match(line)
        if fence is None:
            if m:
                fence = m[1]
                continue
            yield number, line
        elif (
            m and m[1][0] == fence[0] and len(m[1]) >= len(fence) and not line.strip(m[1][0] + " ")
        ):
            fence = None


def heading_text(markdown: str) -> str:
    """A heading's text as GitHub renders it: code spans as their text, links as their label,
    emphasis markers and HTML tags gone."""
    text = CODE_SPAN.sub(lambda m: m[2].strip(), markdown)
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", text)
    text = re.sub(r"<[^>]+>", "", text)
    return re.sub(r"(\*+|(?<!\w)_+|_+(?!\w))", "", text)


def slug(text: str) -> str:
    """GitHub's anchor for a heading with this (rendered) text, before de-duplication."""
    kept = "".join(c for c in text.lower() if c in " -_" or unicodedata.category(c)[0] in "LN")
    return kept.replace(" ", "-")


def anchors(text: str) -> set[str]:
    """The anchors of a page's headings (and of explicit ``id``/``name`` attributes)."""
    seen: dict[str, int] = {}
    found: set[str] = set()
    for _, line in prose_lines(text):
        m = HEADING.match(line)
        if m:
            base = slug(heading_text(m[2]))
            count = seen.get(base, 0)
            seen[base] = count + 1
            found.add(base if count == 0 else f"{base}-{count}")
        found.update(re.findall(r"""\b(?:id|name)\s*=\s*["']([^"']+)["']""", line))
    return found


def links(text: str) -> Iterator[tuple[int, str]]:
    """Every link target of a page, with its line number; code is not looked into."""
    for number, line in prose_lines(text):
        bare = CODE_SPAN.sub(lambda m: " " * len(m[0]), line)
        for m in INLINE_LINK.finditer(bare):
            yield number, m[1]
        m = REFERENCE.match(bare)
        if m:
            yield number, m[1]
        for m in HTML_ATTR.finditer(bare):
            yield number, m[1]


def broken_links(page: Path, text: str, root: Path = ROOT) -> list[str]:
    """What is wrong with the links of ``text``, the contents of ``page``: one line each."""
    charts_pending = not re.search(r"^charts\s*:", (root / "Makefile").read_text(), re.M)
    problems = []
    own = page.relative_to(root)
    for number, target in links(text):
        if not target or SCHEME.match(target):
            continue
        path, _, anchor = target.partition("#")
        if path:
            resolved = root / path.lstrip("/") if path.startswith("/") else page.parent / path
            try:
                rel = resolved.resolve().relative_to(root)
            except ValueError:
                problems.append(f"{own}:{number}: {target} leaves the repository")
                continue
            if not (root / rel).exists():
                if charts_pending and rel.as_posix() in CHART_OUTPUTS:
                    continue
                problems.append(f"{own}:{number}: {target}: no such file or folder {rel}")
                continue
            linked: Path | None = root / rel
            name = rel.as_posix()
        else:
            linked, name = None, own.as_posix()  # an anchor of this page
        if not anchor:
            continue
        if linked is None:
            found = anchors(text)
        elif linked.suffix == ".md" and linked.is_file():
            found = anchors(linked.read_text(encoding="utf-8"))
        else:
            continue  # an anchor into a source file or a folder: GitHub's line anchors and such
        if anchor not in found:
            problems.append(f"{own}:{number}: {target}: no heading #{anchor} in {name}")
    return problems


@pytest.mark.parametrize("page", pages(), ids=lambda p: p.relative_to(ROOT).as_posix())
def test_every_relative_link_and_anchor_resolves(page: Path) -> None:
    assert page.is_file(), page
    assert broken_links(page, page.read_text(encoding="utf-8")) == []


def test_every_docs_page_is_in_the_index() -> None:
    index = (ROOT / "docs/README.md").read_text(encoding="utf-8")
    named = {target.partition("#")[0] for _, target in links(index)}
    for page in (ROOT / "docs").glob("*.md"):
        if page.name != "README.md":
            assert page.name in named, f"docs/README.md does not link to {page.name}"


# The native crate's comments cite the Python side by path (`pipeline/format/record.py`) or by
# import name (`rocketstore.pipeline.errors.NativeError`): both must still name something.
CITED_PATH = re.compile(r"`((?:pipeline|sink|source|datasource|jobs|tests|bench|docs)/[\w/.-]+)`")
CITED_NAME = re.compile(r"`(rocketstore(?:\.\w+)+)`")


def resolves(name: str) -> bool:
    """Whether ``a.b.c`` is a module, or a module's attribute (chain)."""
    parts = name.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            obj: object = importlib.import_module(".".join(parts[:cut]))
        except ImportError:
            continue
        for attr in parts[cut:]:
            if not hasattr(obj, attr):
                return False
            obj = getattr(obj, attr)
        return True
    return False


def cited(text: str) -> Iterator[tuple[int, str, str]]:
    """(line, "path" or "name", what) for each citation in the comments of Rust source."""
    for n, line in enumerate(text.splitlines(), 1):
        if "//" in line:
            comment = line[line.index("//") :]
            yield from ((n, "path", m) for m in CITED_PATH.findall(comment))
            yield from ((n, "name", m) for m in CITED_NAME.findall(comment))


def test_the_native_crates_comments_cite_what_exists() -> None:
    bad = []
    for rs in sorted((ROOT / "native/src").glob("*.rs")):
        for n, kind, what in cited(rs.read_text(encoding="utf-8")):
            ok = (ROOT / what).exists() if kind == "path" else resolves(what)
            if not ok:
                bad.append(f"native/src/{rs.name}:{n}: {what}")
    assert bad == []


# -- the checker itself ---------------------------------------------------------------------------


def test_the_citation_check_finds_a_moved_path_and_a_gone_name() -> None:
    text = "let x = 1; // see `pipeline/record.py` and `rocketstore.pipeline.errors.NoSuchError`"
    found = list(cited(text))
    assert found == [
        (1, "path", "pipeline/record.py"),
        (1, "name", "rocketstore.pipeline.errors.NoSuchError"),
    ]
    assert not (ROOT / "pipeline/record.py").exists()
    assert not resolves("rocketstore.pipeline.errors.NoSuchError")
    assert resolves("rocketstore.pipeline.errors.NativeError")
    assert resolves("rocketstore.pipeline.format.native.strings")


def test_slugs_follow_githubs_rule() -> None:
    text = "\n".join(
        [
            "# rocketstore",
            "## RocketMQ's servers and clients on the same files",
            "## The store part (`bench/store.py`)",
            "### Figures",
            "### Figures",
            "## Durability **and** recovery",
            "## Using [the engine](docs/x.md) from Python",
            "```",
            "# not a heading",
            "```",
        ]
    )
    assert anchors(text) == {
        "rocketstore",
        "rocketmqs-servers-and-clients-on-the-same-files",
        "the-store-part-benchstorepy",
        "figures",
        "figures-1",
        "durability-and-recovery",
        "using-the-engine-from-python",
    }


def test_the_checker_finds_a_bad_anchor_a_missing_file_and_nothing_in_code() -> None:
    page = ROOT / "docs/example.md"
    text = "\n".join(
        [
            "# Example",
            "## Options",
            "Good: [here](#options), [front](../README.md#rocketstore), [root](../README.md).",
            "Bad anchor: [there](#no-such-heading).",
            "Bad file: ![chart](images/nothing.svg) and [x](missing.md).",
            "In code: `[x](nowhere.md)` and a URL [site](https://example.com/#x).",
            "```",
            "[y](nowhere-either.md)",
            "```",
        ]
    )
    problems = broken_links(page, text)
    assert len(problems) == 3, problems
    assert "docs/example.md:4: #no-such-heading: no heading #no-such-heading" in problems[0]
    assert "images/nothing.svg" in problems[1] and "missing.md" in problems[2]


def test_the_chart_exception_covers_only_the_three_charts(tmp_path: Path) -> None:
    (tmp_path / "docs").mkdir()
    page = tmp_path / "docs/benchmarks.md"
    text = "![t](images/throughput.svg) ![l](images/latency.svg) ![f](images/floors.svg) ![o](images/other.svg)"
    (tmp_path / "Makefile").write_text("bench:\n\tpython -m bench\n")
    assert broken_links(page, text, tmp_path) == [
        "docs/benchmarks.md:1: images/other.svg: no such file or folder docs/images/other.svg"
    ]
    (tmp_path / "Makefile").write_text("charts: ## Draw the charts\n\tpython -m bench charts\n")
    assert len(broken_links(page, text, tmp_path)) == 4
