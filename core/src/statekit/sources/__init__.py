"""Sources that read input exactly once: log files that rotate, and the fate of bad records.

What it holds: ``LogSource`` (lines of files that grow, rotate, move and
appear, followed by file identity, with the position in statekit's
checkpoint: ``_logsource``, and where its files are now: ``_locating``),
``BadRecord`` and ``BadRecordPolicy`` (what a record that cannot be
processed carries, and ``statekit.bad-records.*``: fail, or dead letters with
a budget: ``_badrecords``, ``_deadletters``), and what the source reports when
input is lost (``LostInput``, ``InputLostWarning``). A job author imports
these from :mod:`statekit`, their one public home; this package exports the
constants and helpers runners share (position tags, configuration keys, line
limits).

What it may import: the standard library, statekit's errors
(``statekit._errors``) and its local-file helpers (``statekit._localfs``),
nothing else of statekit: the runners import it, not the other way round.
"""

from __future__ import annotations

from typing import Any

from .._errors import warn_moved
from . import _badrecords, _locating, _logsource
from ._badrecords import RAW_TEXT_LIMIT, bad_record_error
from ._files import COMPRESSED_SUFFIXES, FINGERPRINT_BYTES, LONG_LINE_HEAD, MAX_LINE_BYTES
from ._logsource import FOLLOW_SYMLINKS_KEY, MAX_LINE_BYTES_KEY, POSITION_TAG

__all__ = [
    "COMPRESSED_SUFFIXES",
    "FINGERPRINT_BYTES",
    "FOLLOW_SYMLINKS_KEY",
    "LONG_LINE_HEAD",
    "MAX_LINE_BYTES",
    "MAX_LINE_BYTES_KEY",
    "POSITION_TAG",
    "RAW_TEXT_LIMIT",
    "bad_record_error",
]

#: Names this package exported before their one home became :mod:`statekit`.
_MOVED = {
    "BadRecord": _badrecords,
    "BadRecordPolicy": _badrecords,
    "InputLostWarning": _locating,
    "LostInput": _locating,
    "LogSource": _logsource,
}


def __getattr__(name: str) -> Any:
    """The names that moved to :mod:`statekit`, for one release, with a DeprecationWarning."""
    module = _MOVED.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    warn_moved(__name__, name, "statekit")
    return getattr(module, name)
