"""State as data: read, query, bootstrap and rewrite checkpoints and savepoints.

Like Flink's State Processor API, without a running job:

- :class:`SavepointReader` opens any checkpoint or savepoint (a local path,
  ``s3://``, any fsspec URL, or a location of a given storage), lists its
  operators and states, reads a keyed state as Arrow record batches one key
  group at a time (filters by key group or key read only the blocks they
  need), answers point queries from one key-group block, and reads timers,
  operator state and raw state (as bytes, ``raw_state``).
- :func:`checkpoint_history` reads a job's checkpoint history: every
  checkpoint attempt, beyond retention, with its status, times and sizes
  (:class:`statekit.checkpointing.CheckpointAttempt`).
- :class:`SavepointWriter` builds a canonical savepoint from rows, an Arrow
  table or a pandas DataFrame (on Spark, :func:`statekit.spark.write_savepoint`
  writes a DataFrame in parallel by key group), or rewrites an existing one:
  drop, rename or map a state, change the max parallelism. A job starts from
  the result with ``restore=<location>``.

The modules inside are private: ``_reader`` (the reader), ``_blocks`` (the
blocks a read takes, a native snapshot restored first), ``_info`` (what the
reader lists), ``_arrow`` (Arrow types of serializers) and ``_writer``.
"""

from __future__ import annotations

from .._errors import install_hint

try:
    import pyarrow  # type: ignore[import-untyped]  # noqa: F401
except ModuleNotFoundError as exc:  # pragma: no cover - depends on the installation
    raise ModuleNotFoundError(
        "statekit.state_processor needs pyarrow, which is not installed. Install it with: "
        + install_hint("statekit[arrow]"),
        name=exc.name,
    ) from exc

from ..state._migration import SchemaStep
from ..state._raw import RawSnapshot
from ._arrow import arrow_type
from ._info import OperatorInfo, StateInfo
from ._reader import SavepointReader, checkpoint_history, open_storage
from ._writer import SavepointWriter

__all__ = [
    "OperatorInfo",
    "RawSnapshot",
    "SavepointReader",
    "SavepointWriter",
    "SchemaStep",
    "StateInfo",
    "arrow_type",
    "checkpoint_history",
    "open_storage",
]
