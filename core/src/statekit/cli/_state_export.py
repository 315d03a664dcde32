"""The files ``statekit state export`` writes: JSON lines, CSV or Parquet, published whole or not at all."""

from __future__ import annotations

import base64
import os
from typing import Any

import pyarrow as pa  # type: ignore[import-untyped]

from .._errors import ConfigurationError
from ._state_json import dumps, is_binary, json_rows

__all__ = ["FORMATS", "SUFFIXES", "ExportWriter", "check_target", "publish_export"]

FORMATS = ("json", "csv", "parquet")
SUFFIXES = {".json": "json", ".jsonl": "json", ".ndjson": "json", ".csv": "csv", ".parquet": "parquet"}


class ExportWriter:
    """Writes record batches to one file in one format."""

    def __init__(self, fmt: str, path: str, schema: pa.Schema) -> None:
        self.fmt = fmt
        self._file = open(path, "wb")  # noqa: SIM115 - closed in close()
        self._writer: Any = None
        self._schema = schema
        # CSV cannot hold raw bytes: its bytes columns are written as base64 text.
        self._binary = [i for i, f in enumerate(schema) if is_binary(f.type)]
        try:
            if fmt == "parquet":
                import pyarrow.parquet as pq  # type: ignore[import-untyped]

                self._writer = pq.ParquetWriter(self._file, schema)
            elif fmt == "csv":
                import pyarrow.csv as pcsv  # type: ignore[import-untyped]

                for i in self._binary:
                    self._schema = self._schema.set(i, pa.field(schema.field(i).name, pa.string()))
                self._writer = pcsv.CSVWriter(self._file, self._schema)
        except BaseException:
            self._file.close()
            raise

    def write(self, batch: pa.RecordBatch) -> None:
        if self.fmt == "json":
            self._file.write("".join(dumps(row) + "\n" for row in json_rows(batch)).encode())
        elif self.fmt == "csv":
            cols = list(batch.columns)
            for i in self._binary:
                cols[i] = pa.array(
                    [None if v is None else base64.b64encode(v).decode("ascii") for v in cols[i].to_pylist()],
                    pa.string(),
                )
            self._writer.write_batch(pa.RecordBatch.from_arrays(cols, schema=self._schema))
        else:
            self._writer.write_batch(batch)

    def close(self) -> None:
        try:
            if self._writer is not None:
                self._writer.close()
        finally:
            self._file.close()


def check_target(path: str, overwrite: bool) -> None:
    """Refuses, before anything is read, a directory, or an existing file unless ``overwrite``."""
    if os.path.isdir(path):
        raise ConfigurationError(f"cannot write {path}: it is a directory")
    if not overwrite and os.path.lexists(path):
        raise ConfigurationError(f"{path} exists; pass --overwrite to replace it")


def publish_export(tmp: str, path: str, overwrite: bool) -> None:
    """Renames the finished ``tmp`` to ``path``; without ``overwrite``, never over a file made meanwhile."""
    if overwrite:
        os.replace(tmp, path)
        return
    try:
        os.link(tmp, path)  # fails if path exists, where a rename would replace it
    except FileExistsError:
        raise ConfigurationError(f"{path} exists (it was made during the export); pass --overwrite") from None
    except OSError:  # a file system without hard links: check, then rename
        if os.path.lexists(path):
            raise ConfigurationError(f"{path} exists; pass --overwrite to replace it") from None
        os.replace(tmp, path)
        return
    os.remove(tmp)
