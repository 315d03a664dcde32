"""Sources that read input exactly once: log files that rotate, and the fate of bad records.

What it holds: :class:`LogSource` (lines of files that grow, rotate, move and
appear, followed by file identity, with the position in statekit's
checkpoint), :class:`BadRecord` and :class:`BadRecordPolicy` (what a record
that cannot be processed carries, and ``statekit.bad-records.*``: fail, or
dead letters with a budget), and what the source reports when input is lost.

What it may import: the standard library, statekit's errors
(``statekit._errors``) and its local-file helpers (``statekit._localfs``),
nothing else of statekit: the runners import it, not
the other way round. The modules inside are private; this package's names are
the API, re-exported by :mod:`statekit`.
"""

from __future__ import annotations

from ._badrecords import RAW_TEXT_LIMIT, BadRecord, BadRecordPolicy, bad_record_error
from ._files import COMPRESSED_SUFFIXES, FINGERPRINT_BYTES, LONG_LINE_HEAD, MAX_LINE_BYTES
from ._locating import InputLostWarning, LostInput
from ._logsource import FOLLOW_SYMLINKS_KEY, MAX_LINE_BYTES_KEY, POSITION_TAG, LogSource

__all__ = [
    "COMPRESSED_SUFFIXES",
    "FINGERPRINT_BYTES",
    "FOLLOW_SYMLINKS_KEY",
    "LONG_LINE_HEAD",
    "MAX_LINE_BYTES",
    "MAX_LINE_BYTES_KEY",
    "POSITION_TAG",
    "RAW_TEXT_LIMIT",
    "BadRecord",
    "BadRecordPolicy",
    "InputLostWarning",
    "LogSource",
    "LostInput",
    "bad_record_error",
]
