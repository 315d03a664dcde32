"""The fenced code blocks of README.md and docs/, as the docs tests run them.

A block's info string says what it is: its language, then ``runnable`` (the
tests run it, on ``statekit-urlcount generate`` output) or ``illustrative``
(a synopsis, a sketch, something that needs a cluster or a package index).
Every block that shows a ``statekit`` or ``statekit-urlcount`` command must
say one or the other: :func:`unmarked_cli_blocks` finds those that do not.

Runnable shell blocks come in two forms: ``sh runnable``, one command per
line (``# comments`` allowed), and ``console runnable``, commands after a
``$ `` prompt, each followed by what it prints.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
_FENCE = re.compile(r"^(```+)(.*)$")
_CLI = re.compile(r"^(\$ )?(statekit|statekit-urlcount)( |$)", re.MULTILINE)


@dataclass(frozen=True)
class Block:
    """One fenced block: where it is, its info string's words, and its text."""

    path: Path
    line: int  # of the opening fence, from 1
    lang: str
    marks: frozenset[str]
    text: str

    @property
    def where(self) -> str:
        return f"{self.path.relative_to(ROOT)}:{self.line}"

    @property
    def runnable(self) -> bool:
        return "runnable" in self.marks

    @property
    def shows_cli(self) -> bool:
        return bool(_CLI.search(self.text))


def blocks(path: Path) -> Iterator[Block]:
    """Every fenced block of ``path``, in order."""
    fence: str | None = None
    start, info, body = 0, "", []
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        match = _FENCE.match(line)
        if fence is None:
            if match:
                fence, start, info, body = match[1], number, match[2].strip(), []
            continue
        if match and match[1] == fence and not match[2].strip():
            words = info.split()
            yield Block(path, start, words[0] if words else "", frozenset(words[1:]), "\n".join(body) + "\n")
            fence = None
            continue
        body.append(line)


def all_blocks() -> list[Block]:
    return [b for path in DOCS for b in blocks(path)]


def unmarked_cli_blocks() -> list[str]:
    """Blocks that show a command but say neither ``runnable`` nor ``illustrative``."""
    return [b.where for b in all_blocks() if b.shows_cli and not b.marks & {"runnable", "illustrative"}]


def readme_block(section: str, index: int = 0) -> Block:
    """The ``index``-th python block under the README heading ``## <section>``."""
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    start = text.index(f"\n## {section}\n")
    end = text.find("\n## ", start + 1)
    first, last = text[:start].count("\n") + 1, text[: end if end >= 0 else len(text)].count("\n") + 1
    found = [b for b in blocks(ROOT / "README.md") if first <= b.line <= last and b.lang == "python"]
    return found[index]


def commands(block: Block) -> list[tuple[str, list[str]]]:
    """A runnable shell block's commands, each with the output lines the block shows after it."""
    out: list[tuple[str, list[str]]] = []
    for line in block.text.splitlines():
        if block.lang == "console":
            if line.startswith("$ "):
                out.append((line[2:].strip(), []))
            elif out and line.strip():
                out[-1][1].append(line)
        elif line.strip() and not line.lstrip().startswith("#"):
            out.append((line.strip(), []))
    return out


_INLINE_PIP = re.compile(r"`(pip install [^`]+)`")
_STATEKIT_DIST = re.compile(r"""(^|[\s"'])statekit(-[a-z]+)?(\[|[\s"']|$)""")


def pip_commands() -> list[tuple[str, str]]:
    """Every ``pip install`` of a statekit distribution the docs show: ``(where, command)``.

    From fenced blocks (a line that starts with it, its ``# comment`` cut) and
    from inline code (``pip install …`` in backticks, which may wrap a line).
    Editable installs from a checkout (``-e ./core``) are left out.
    """
    found: list[tuple[str, str]] = []
    for path in DOCS:
        for b in blocks(path):
            for k, line in enumerate(b.text.splitlines(), 1):
                command = line.split(" #", 1)[0].strip().removeprefix("$ ")
                if command.startswith("pip install "):
                    found.append((f"{b.path.relative_to(ROOT)}:{b.line + k}", command))
        text = path.read_text(encoding="utf-8")
        for m in _INLINE_PIP.finditer(text):
            line = text[: m.start()].count("\n") + 1
            found.append((f"{path.relative_to(ROOT)}:{line}", " ".join(m[1].split())))
    return [(w, c) for w, c in found if " -e " not in f" {c} " and _STATEKIT_DIST.search(c.split(" ", 2)[2])]
