"""Every relative link in README.md, docs/**/*.md and experiments/README.md resolves: the file
exists, and a `#anchor` into a Markdown file names one of its headings (GitHub's slugs)."""
from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
FENCE = re.compile(r"^```.*?^```", re.S | re.M)
CODE = re.compile(r"`[^`\n]*`")
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)\)")
HEADING = re.compile(r"^#{1,6} +(.+?) *#*$", re.M)


def markdown_files(root: Path = REPO) -> list[Path]:
    return [root / "README.md", root / "experiments" / "README.md", *sorted((root / "docs").rglob("*.md"))]


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link in a heading anchors by its text
    text = re.sub(r"[^\w\- ]", "", text.lower())
    return text.replace(" ", "-")


def anchors(path: Path) -> set[str]:
    seen: dict[str, int] = {}
    out = set()
    for heading in HEADING.findall(FENCE.sub("", path.read_text())):
        base = slug(heading)
        n = seen.get(base, 0)
        seen[base] = n + 1
        out.add(base if n == 0 else f"{base}-{n}")
    return out


def broken_links(path: Path) -> list[str]:
    """The links of one Markdown file that do not resolve, as 'file: target (why)'."""
    text = CODE.sub("", FENCE.sub("", path.read_text()))
    bad = []
    for target in LINK.findall(text):
        if re.match(r"[a-z][a-z0-9+.-]*:", target):  # http:, https:, mailto:
            continue
        file_part, _, anchor = target.partition("#")
        resolved = (path.parent / file_part).resolve() if file_part else path
        if not resolved.exists():
            bad.append(f"{path}: {target} (no such file)")
        elif anchor and resolved.suffix == ".md" and anchor not in anchors(resolved):
            bad.append(f"{path}: {target} (no heading #{anchor} in {resolved.name})")
    return bad


def test_every_relative_link_resolves():
    bad = [b for path in markdown_files() for b in broken_links(path)]
    assert not bad, "\n".join(bad)


def test_the_checker_catches_a_dead_file_and_a_dead_anchor(tmp_path):
    (tmp_path / "other.md").write_text("# Title\n\n## A section: with punctuation?\n")
    doc = tmp_path / "doc.md"
    doc.write_text("[ok](other.md#a-section-with-punctuation) [dead](missing.md) [anchor](other.md#nope)\n"
                   "`[in code](missing.md)`\n```\n[in a block](missing.md)\n```\n")
    bad = broken_links(doc)
    assert len(bad) == 2
    assert "missing.md (no such file)" in bad[0] and "#nope" in bad[1]


def test_results_documents_open_with_their_command_and_files():
    """Each results document says, before its first section, how it is regenerated and what it reads."""
    docs = sorted((REPO / "docs" / "results").glob("*.md"))
    assert {"speed.md", "whole_step.md", "gradient_quality.md", "bias.md", "training.md", "long_runs.md",
            "embedded_task.md"} <= {d.name for d in docs}
    for doc in docs:
        head = doc.read_text().split("\n## ", 1)[0]
        if doc.name in ("README.md", "reliability.md", "precision.md"):
            continue  # the index; documents that others keep
        assert "Regenerate" in head and "Reads" in head and "experiments/results/" in head, doc.name


def test_readme_is_a_front_door():
    text = (REPO / "README.md").read_text()
    assert len(text.splitlines()) <= 200
    headings = ["## Quickstart", "## Training", "## Sweeps", "## Evaluation", "## Extending", "## Results", "## Layout"]
    assert [h for h in re.findall(r"^## .*$", text, re.M) if h in headings] == headings  # training before results
    # the quickstart's two commands, unchanged
    assert ('python3 -m venv .venv && .venv/bin/pip install -e ".[dev]" && .venv/bin/python -m jagg_lab.train '
            '+experiment=awm heldout.final_n_samples=2048') in text
    assert 'python3 -m venv .venv && .venv/bin/pip install -e ".[dev]" && .venv/bin/python -m pytest\n' in text
    # every table's cells are free of links (a column's evidence is linked from its header)
    rows = [line for line in text.splitlines() if line.startswith("|")]
    tables = text.split("\n\n")
    for table in (t for t in tables if t.lstrip().startswith("|") or "<!-- table:" in t):
        body = [line for line in table.splitlines() if line.startswith("|")][2:]
        assert not any("](" in line for line in body), table
    assert rows


def test_every_method_section_a_docstring_names_exists():
    """Code and tests cite the method by `docs/method.md section N` (or `sections N-M`): each N
    must be a numbered section of that document."""
    sections = {int(m) for m in re.findall(r"^## (\d+)\.", (REPO / "docs" / "method.md").read_text(), re.M)}
    cited = []
    for path in [*(REPO / "jagg_lab").rglob("*.py"), *(REPO / "tests").rglob("*.py")]:
        for a, b in re.findall(r"docs/method\.md sections? (\d+)(?:-(\d+))?", path.read_text()):
            cited += [(path.name, n) for n in range(int(a), int(b or a) + 1)]
    assert len(cited) >= 9 and sections >= {1, 2, 3, 8}
    assert not [c for c in cited if c[1] not in sections], sorted(sections)
    assert not [p for p in (REPO / "jagg_lab").rglob("*.py") if "JAGG.md" in p.read_text()]  # a file that ships nowhere
