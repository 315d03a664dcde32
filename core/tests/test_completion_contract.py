"""The native completion contract is stated once, in the same words, wherever a backend author reads it.

``docs/writing-a-backend.md``, the docstrings of :class:`statekit.backend_api.SupportsNativeSnapshot`
and of the native snapshot module (``statekit.snapshot_codec.NativeSnapshot``'s), and
``statekit.testing`` must not drift apart: the LevelDB author of issue #24 passed
the kit only by working around a page and a kit that disagreed.
"""

from __future__ import annotations

import inspect
import re
from pathlib import Path

import statekit.testing
from statekit.backend_api import SupportsNativeSnapshot
from statekit.snapshot_codec import NativeSnapshot

PAGE = Path(__file__).resolve().parents[2] / "docs" / "writing-a-backend.md"
START = "The completion contract."
END = "abort them)."


def _contract(text: str, where: str) -> str:
    """The contract's paragraph in ``text``, its whitespace (and Markdown quote marks) normalised."""
    flat = " ".join(re.sub(r"^\s*>\s?", "", line) for line in text.splitlines())
    flat = re.sub(r"\s+", " ", flat)
    start = flat.find(START)
    assert start >= 0, f"{where} does not state the completion contract"
    end = flat.find(END, start)
    assert end >= 0, f"{where}: the completion contract does not end with {END!r}"
    return flat[start : end + len(END)]


def test_the_completion_contract_reads_the_same_everywhere() -> None:
    page = _contract(PAGE.read_text(), str(PAGE))
    sources = {
        "SupportsNativeSnapshot": inspect.getdoc(SupportsNativeSnapshot) or "",
        "the native snapshot module": inspect.getdoc(inspect.getmodule(NativeSnapshot)) or "",
        "statekit.testing": inspect.getdoc(statekit.testing) or "",
    }
    for where, doc in sources.items():
        assert _contract(doc, where) == page, f"{where} states the completion contract unlike {PAGE.name}"


def test_the_contract_names_what_a_backend_keys_its_uploads_by() -> None:
    page = _contract(PAGE.read_text(), str(PAGE))
    # How a backend knows: the checkpoint id of the output, and completion notices; no output types.
    assert "out.checkpoint_id" in page
    assert "notify_checkpoint_complete(m)" in page
    assert "whatever output or storage a snapshot writes to" in page
