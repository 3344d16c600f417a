"""Reading the repository's Markdown pages: tests run their code blocks exactly as written."""

from __future__ import annotations

from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def doc_text(path: str, title: str | None = None) -> str:
    """A Markdown page of the repository, or one `## title` section of it (up to the next `## `)."""
    text = (REPO / path).read_text()
    if title is None:
        return text
    start = text.index(f"\n## {title}\n")
    end = text.find("\n## ", start + 1)
    return text[start : end if end != -1 else len(text)]


def code_blocks(text: str, language: str) -> list[str]:
    """The fenced code blocks of one language, in order, exactly as written."""
    blocks, current = [], None
    for line in text.splitlines(keepends=True):
        if current is None and line.strip() == f"```{language}":
            current = []
        elif current is not None and line.strip() == "```":
            blocks.append("".join(current))
            current = None
        elif current is not None:
            current.append(line)
    return blocks
