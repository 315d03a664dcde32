"""Where entries live in an environment: a named database per state, read in key order.

Each state is the named database ``state:<name>`` of the subtask's
environment; the main database holds nothing but LMDB's records of them. Keys
are core's composite keys (``statekit.ordered_kv.KeyLayout``: key group
first, so a key group, and a subtask's key-group range, is one contiguous
range of every database), values the bytes of ``entry_codec`` units.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from statekit.errors import StateAccessError

__all__ = [
    "BULK_CHUNK",
    "DATA_FILE",
    "DB_PREFIX",
    "MAX_KEY_SIZE",
    "db_name",
    "iterate",
    "read_range",
    "state_names",
]

#: The data file of an environment (``subdir=True``), and the one file of a native snapshot.
DATA_FILE = "data.mdb"
#: Named databases of states are ``state:<state name>``.
DB_PREFIX = b"state:"
#: Entries one write transaction of a bulk load or delete (restore, rescale, clipping) holds at most.
BULK_CHUNK = 50_000
#: LMDB's limit on key size (``MDB_MAXKEYSIZE`` of py-lmdb's build); ``env.max_key_size()`` says.
MAX_KEY_SIZE = 511


def db_name(state: str) -> bytes:
    """The name of state ``state``'s database."""
    name = DB_PREFIX + state.encode("utf-8", "surrogatepass")
    if len(name) > MAX_KEY_SIZE:
        raise StateAccessError(
            f"state name {state[:40]!r}... is {len(name) - len(DB_PREFIX)} bytes in UTF-8; LMDB names "
            f"databases with keys of at most {MAX_KEY_SIZE - len(DB_PREFIX)} bytes: use a shorter name"
        )
    return name


def state_names(txn: Any) -> list[str]:
    """Names of the states whose databases an environment holds (read through ``txn``)."""
    out = []
    with txn.cursor() as cur:
        if cur.set_range(DB_PREFIX):
            for k in cur.iternext(keys=True, values=False):
                if not k.startswith(DB_PREFIX):
                    break
                out.append(k[len(DB_PREFIX) :].decode("utf-8", "surrogatepass"))
    return out


def iterate(txn: Any, start: bytes) -> Iterator[tuple[bytes, bytes]]:
    """``(key, value)`` of the default database of ``txn`` in key order, from ``start`` to the end."""
    with txn.cursor() as cur:
        if cur.set_range(start):
            yield from cur.iternext()


def read_range(txn: Any, db: Any, lower: bytes, upper: bytes | None) -> list[tuple[bytes, bytes]]:
    """Every ``(key, value)`` of ``db`` with ``lower <= key < upper`` (upper None: to the end)."""
    out: list[tuple[bytes, bytes]] = []
    with txn.cursor(db=db) as cur:
        if not cur.set_range(lower):
            return out
        if upper is None:
            out.extend(cur.iternext())
            return out
        append = out.append
        for k, v in cur.iternext():
            if k >= upper:
                break
            append((k, v))
    return out
