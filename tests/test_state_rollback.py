"""Renames are reversible and rollbacks are caught (issue 42, point 4): real LocalRunners, real checkpoints.

Run 1 counts in ``Counts{count}``; run 2 renames the field (``hits``, formerly
``count``). Code rolled back to run 1's class is refused by default, naming
the state, both schemas and the ways out, instead of silently resetting every
count to 0; declared on purpose (a new version), or as code that is not an
exact older schema, the rename is undone and every count goes on.
"""

from __future__ import annotations

import dataclasses
from collections import Counter
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import pytest

from statekit import (
    KeyedProcessFunction,
    LocalRunner,
    ProcessContext,
    RecordSource,
    RuntimeContext,
    ValueStateDescriptor,
)
from statekit.errors import StateMigrationError
from statekit.serialization._evolution import resolve_schema
from statekit.serialization._serializers import DataclassSerializer

URLS = [f"/p{i}" for i in range(7)]
RECORDS = [{"url": URLS[i % len(URLS)]} for i in range(140)]


@dataclasses.dataclass
class Counts:
    count: int = 0


@dataclasses.dataclass
class Renamed:
    hits: int = dataclasses.field(default=0, metadata={"statekit.former_names": ("count",)})


@dataclasses.dataclass
class Extended:
    count: int = 0
    extra: int = 0


@dataclasses.dataclass
class CountsWithNote:
    count: int = 0
    note: str = ""


def counting(cls: type, field: str, version: int = 1) -> type[KeyedProcessFunction]:
    class Count(KeyedProcessFunction):
        def open(self, ctx: RuntimeContext) -> None:
            self.state = ctx.get_state(ValueStateDescriptor("visits", cls, default=cls(), version=version))

        def process(self, record: dict[str, Any], ctx: ProcessContext) -> Iterable[Any]:
            v = self.state.value()
            setattr(v, field, getattr(v, field) + 1)
            self.state.update(v)
            return ()

    return Count


def counts_after(
    fn: type[KeyedProcessFunction],
    ckpt: Path,
    part: list[dict[str, Any]],
    cls: type,
    field: str,
    version: int = 1,
) -> dict[str, int]:
    r = LocalRunner(
        fn,
        key_selector=lambda rec: rec["url"],
        config={
            "statekit.checkpoints.dir": str(ckpt),
            "statekit.parallelism": 2,
            "statekit.max-parallelism": 128,
        },
    )
    try:
        r.run(RecordSource(RECORDS), restore="latest", max_records=len(part))  # a list is positional
        r.checkpoint()
        out = {}
        for ctx in r.subtasks:
            kb = ctx.keyed_backend
            state = kb.get_state(ValueStateDescriptor("visits", cls, default=cls(), version=version))
            for k in kb.keys("visits"):
                kb.set_current_key(k)
                out[k] = getattr(state.value(), field)
        return out
    finally:
        r.close()


def expected(records: list[dict[str, Any]]) -> dict[str, int]:
    return dict(Counter(r["url"] for r in records))


def upgraded(tmp_path: Path) -> Path:
    """Run 1 (``count``) over 70 records, run 2 (``hits``, formerly ``count``) over 35 more."""
    ckpt = tmp_path / "ckpt"
    assert counts_after(counting(Counts, "count"), ckpt, RECORDS[:70], Counts, "count") == expected(
        RECORDS[:70]
    )
    assert counts_after(counting(Renamed, "hits"), ckpt, RECORDS[70:105], Renamed, "hits") == expected(
        RECORDS[:105]
    )
    return ckpt


def test_code_rolled_back_over_a_rename_is_refused_naming_both_schemas_and_the_ways_out(
    tmp_path: Path,
) -> None:
    ckpt = upgraded(tmp_path)
    with pytest.raises(StateMigrationError) as e:
        counts_after(counting(Counts, "count"), ckpt, RECORDS[105:], Counts, "count")
    text = str(e.value)
    assert "state 'visits' is declared as Counts{count: int}, an older schema of its history" in text
    assert "the checkpoint holds it as Renamed{hits: int}" in text
    assert "field 'hits' renamed back to 'count'" in text  # what restoring would do
    assert "restore the savepoint taken before the upgrade" in text and "declare version=2" in text
    # Nothing changed: the upgraded code goes on from the same checkpoint, exactly.
    assert counts_after(counting(Renamed, "hits"), ckpt, RECORDS[105:], Renamed, "hits") == expected(RECORDS)


def test_going_back_on_purpose_undoes_the_rename_and_every_count_goes_on(tmp_path: Path) -> None:
    ckpt = upgraded(tmp_path)
    got = counts_after(counting(Counts, "count", version=2), ckpt, RECORDS[105:], Counts, "count", version=2)
    assert got == expected(RECORDS)  # not reset to 0: 'count' takes the values of 'hits'


def test_a_declared_field_matching_a_stored_fields_former_name_takes_its_values(tmp_path: Path) -> None:
    ckpt = upgraded(tmp_path)
    got = counts_after(counting(CountsWithNote, "count"), ckpt, RECORDS[105:], CountsWithNote, "count")
    assert got == expected(RECORDS)
    c = resolve_schema(DataclassSerializer(Renamed).config(), DataclassSerializer(CountsWithNote))
    assert c.migration is not None and "Renamed: field 'hits' renamed back to 'count'" in " ".join(
        c.migration.changes
    ).replace("CountsWithNote", "Renamed")


def test_code_rolled_back_over_an_added_field_is_refused_not_silently_dropping_it(tmp_path: Path) -> None:
    ckpt = tmp_path / "ckpt"
    counts_after(counting(Counts, "count"), ckpt, RECORDS[:70], Counts, "count")
    counts_after(counting(Extended, "extra"), ckpt, RECORDS[70:105], Extended, "extra")
    with pytest.raises(
        StateMigrationError, match=r"restoring would: .*field 'extra' removed \(its values are dropped\)"
    ):
        counts_after(counting(Counts, "count"), ckpt, RECORDS[105:], Counts, "count")


def test_former_names_do_not_change_the_schema_of_a_state_written_before_they_were_kept() -> None:
    """A stored config without ``former_names`` (written before renames kept them) is the same schema."""
    cfg = DataclassSerializer(Renamed).config()
    assert cfg["former_names"] == {"hits": ["count"]}
    older = {k: v for k, v in cfg.items() if k != "former_names"}
    assert resolve_schema(older, DataclassSerializer(Renamed)).kind == "identical"
    assert "former_names" not in DataclassSerializer(Counts).config()


def test_a_restore_that_drops_a_field_holding_values_says_so_where_operators_look(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """RunResult, the log line and the checkpoint history name the state and the field, not only inspect."""
    from statekit.checkpointing import read_checkpoint_history
    from statekit_storage import FileSystemCheckpointStorage

    ckpt = tmp_path / "ckpt"
    counts_after(counting(Extended, "extra"), ckpt, RECORDS[:70], Extended, "extra")
    r = LocalRunner(
        counting(Counts, "count"),
        key_selector=lambda rec: rec["url"],
        config={
            "statekit.checkpoints.dir": str(ckpt),
            "statekit.parallelism": 2,
            "statekit.max-parallelism": 128,
        },
    )
    with caplog.at_level("WARNING", logger="statekit.state"):
        result = r.run(RecordSource(RECORDS), restore="latest", max_records=35)
    r.checkpoint()
    r.close()
    change = "Counts: field 'extra' removed (its values are dropped)"
    assert result.dropped_fields == {"visits": [change]}
    (line,) = [rec.getMessage() for rec in caplog.records if "drops values it holds" in rec.getMessage()]
    assert f"state 'visits': {change}" in line and str(ckpt / "job" / "chk-1") in line
    history = read_checkpoint_history(FileSystemCheckpointStorage(str(ckpt)), "job")
    assert history[-1].dropped_fields == {"visits": [change]}  # the first checkpoint after the restore
    assert [a.dropped_fields for a in history[:-1]] == [{}] * (len(history) - 1)
