"""How states are laid out in a RocksDB instance: one column family per state.

The live instance (``_backend``) creates the families, and a restore
(``_restore``) finds them in downloaded instances by this prefix; both read it
here.
"""

from __future__ import annotations

__all__ = ["CF_PREFIX"]

#: Column families of states are named ``state:<state name>``; ``default`` stays empty.
CF_PREFIX = "state:"
