"""State types that change between runs of a job: restored through the LocalRunner, on every backend.

Run 1 counts visits per URL in an ``int`` and the hours seen in a list of
ints, with TTL off, and checkpoints twice (the second checkpoint of a RocksDB
job is incremental); run 2 declares a dataclass (with a declared migration), a
list of floats and turns TTL on; run 3 adds a field. Every run restores the
latest checkpoint (native on rocksdb and lmdb, canonical on heap and sqlite)
and keeps counting; the last checkpoint's schema history is what
``statekit checkpoints inspect`` and the state processor show.
"""

from __future__ import annotations

import dataclasses
import json
from collections import Counter
from collections.abc import Iterable
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

from statekit import (
    KeyedProcessFunction,
    ListStateDescriptor,
    LocalRunner,
    Migration,
    ProcessContext,
    RecordSource,
    RuntimeContext,
    StateTtlConfig,
    ValueStateDescriptor,
    default_registry,
)
from statekit.backend_api import key_group_for_bytes
from statekit.cli._cli import main
from statekit.errors import IncompatibleSerializerError, StateError, StateMigrationError
from statekit.serializers import StrSerializer
from statekit.state_processor import SavepointReader

BACKENDS = sorted(default_registry().backends())
URLS = [f"/p{i}" for i in range(12)]
RECORDS = [{"url": URLS[i % len(URLS)], "hour": i % 24} for i in range(600)]


@dataclasses.dataclass
class Visits:
    """Run 2's count: how many, and the first hour seen."""

    total: float = dataclasses.field(metadata={"statekit.former_names": ("count",)})
    first_hour: int | None = None


@dataclasses.dataclass
class VisitsV3:
    """Run 3's: a field more (the class moved, too: its fields are what matter)."""

    total: float
    first_hour: int | None = None
    last_hour: int = -1


VisitsV3.__qualname__ = VisitsV3.__name__ = "Visits"


class RunOne(KeyedProcessFunction):
    def open(self, ctx: RuntimeContext) -> None:
        self.count = ctx.get_state(ValueStateDescriptor("visits", int, default=0))
        self.hours = ctx.get_state(ListStateDescriptor("hours", int))

    def process(self, record: dict[str, Any], ctx: ProcessContext) -> Iterable[Any]:
        self.count.update(self.count.value() + 1)
        self.hours.add(record["hour"])
        return ()


TTL = StateTtlConfig(timedelta(days=365))


class RunTwo(KeyedProcessFunction):
    def open(self, ctx: RuntimeContext) -> None:
        self.visits = ctx.get_state(
            ValueStateDescriptor(
                "visits",
                Visits,
                version=2,
                migrations=[Migration(lambda n: Visits(float(n), None), from_version=1)],
            )
        )
        self.hours = ctx.get_state(ListStateDescriptor("hours", float, ttl=TTL))

    def process(self, record: dict[str, Any], ctx: ProcessContext) -> Iterable[Any]:
        v = self.visits.value() or Visits(0.0)
        first = record["hour"] if v.first_hour is None else v.first_hour
        self.visits.update(Visits(v.total + 1, first))
        self.hours.add(float(record["hour"]))
        return ()


class RunThree(KeyedProcessFunction):
    def open(self, ctx: RuntimeContext) -> None:
        self.visits = ctx.get_state(ValueStateDescriptor("visits", VisitsV3, version=2))
        self.hours = ctx.get_state(ListStateDescriptor("hours", float, ttl=TTL))

    def process(self, record: dict[str, Any], ctx: ProcessContext) -> Iterable[Any]:
        v = self.visits.value()
        assert v is not None
        self.visits.update(VisitsV3(v.total + 1, v.first_hour, record["hour"]))
        return ()


def runner(fn: type, ckpt: Path, backend: str, parallelism: int) -> LocalRunner:
    return LocalRunner(
        fn,
        key_selector=lambda r: r["url"],
        config={
            "statekit.checkpoints.dir": str(ckpt),
            "statekit.backend": backend,
            "statekit.parallelism": parallelism,
            "statekit.max-parallelism": 128,
        },
    )


def contents(r: LocalRunner, name: str, descriptor: Any) -> dict[str, Any]:
    out = {}
    for ctx in r.subtasks:
        kb = ctx.keyed_backend
        s = kb.get_state(descriptor)
        for k in kb.keys(name):
            kb.set_current_key(k)
            out[k] = s.value() if name == "visits" else s.get()
    return out


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_job_whose_state_types_change_run_after_run(
    backend: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    ckpt = tmp_path / "ckpt"
    first, second = RECORDS[:200], RECORDS[200:400]  # each run goes on where the last one stopped
    r1 = runner(RunOne, ckpt, backend, 2)
    r1.run(RecordSource(RECORDS), max_records=100)
    r1.checkpoint()
    r1.run(RecordSource(RECORDS), max_records=100)
    chk1 = r1.checkpoint()  # on rocksdb an incremental one, referencing the first's files
    r1.close()

    r2 = runner(RunTwo, ckpt, backend, 3)  # a rescale too
    r2.run(RecordSource(RECORDS), restore="latest", max_records=200)
    seen = Counter(r["url"] for r in first + second)
    visits = contents(r2, "visits", ValueStateDescriptor("visits", Visits, version=2))
    assert {k: v.total for k, v in visits.items()} == {k: float(n) for k, n in seen.items()}
    # The migration knew no hours: the first hour is the first one run 2 saw.
    firsts = {u: next(r["hour"] for r in second if r["url"] == u) for u in seen}
    assert {k: v.first_hour for k, v in visits.items()} == firsts
    hours = contents(r2, "hours", ListStateDescriptor("hours", float, ttl=TTL))
    assert hours == {u: [float(r["hour"]) for r in first + second if r["url"] == u] for u in seen}
    assert all(type(h) is float for hs in hours.values() for h in hs)
    chk2 = r2.checkpoint()
    r2.close()

    r3 = runner(RunThree, ckpt, backend, 2)
    r3.run(RecordSource(RECORDS), restore="latest")
    chk3 = r3.checkpoint()
    everything = Counter(r["url"] for r in RECORDS)
    v3 = contents(r3, "visits", ValueStateDescriptor("visits", VisitsV3, version=2))
    assert {k: v.total for k, v in v3.items()} == {k: float(n) for k, n in everything.items()}
    assert {v.last_hour for v in v3.values()} != {-1}
    r3.close()

    # The schema history: in the metadata, the CLI and the state processor.
    assert main(["checkpoints", "inspect", chk3, "--json"]) == 0
    states = json.loads(capsys.readouterr().out)["states"]
    history = states["process/visits"]["lineage"]
    assert [h["serializer"]["id"] for h in history] == ["int", "dataclass"]
    assert [h["schema_version"] for h in history] == [1, 2]
    assert [h["migration"] for h in history] == ["function", "converted"]
    assert [h["restored_from"]["checkpoint_id"] for h in history] == [
        int(chk1.rsplit("-", 1)[1]),
        int(chk2.rsplit("-", 1)[1]),
    ]
    assert states["process/hours"]["lineage"][0]["ttl"] is None
    assert main(["checkpoints", "inspect", chk3]) == 0
    table = capsys.readouterr().out
    assert "Visits{total: float, first_hour: optional<int>, last_hour: int}" in table
    assert f"until the restore of checkpoint {chk1.rsplit('-', 1)[1]} (a declared migration)" in table
    assert "TTL turned on" in table
    reader = SavepointReader.open(chk3)
    steps = reader.state("process", "visits").history
    assert [s.schema for s in steps] == [
        "int",
        "Visits{total: float, first_hour: optional<int>}",
        "Visits{total: float, first_hour: optional<int>, last_hour: int}",
    ]
    assert [s.until.split(" (")[0] for s in steps] == [
        f"until the restore of checkpoint {chk1.rsplit('-', 1)[1]}",
        f"until the restore of checkpoint {chk2.rsplit('-', 1)[1]}",
        "now",
    ]


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_refused_change_names_both_schemas_and_the_checkpoint_stays_usable(
    backend: str, tmp_path: Path
) -> None:
    ckpt = tmp_path / "ckpt"
    r1 = runner(RunOne, ckpt, backend, 2)
    r1.run(RecordSource(RECORDS), max_records=100)
    r1.checkpoint()
    r1.close()

    class Narrowed(RunOne):
        def open(self, ctx: RuntimeContext) -> None:
            self.count = ctx.get_state(ValueStateDescriptor("visits", str, default=""))

    bad = runner(Narrowed, ckpt, backend, 2)
    with pytest.raises(
        IncompatibleSerializerError, match=r"state 'visits' was written as int and is declared as str"
    ):
        bad.run(RecordSource(RECORDS), restore="latest")
    bad.close()
    again = runner(RunOne, ckpt, backend, 2)
    again.run(RecordSource(RECORDS), restore="latest")
    assert contents(again, "visits", ValueStateDescriptor("visits", int, default=0)) == dict(
        Counter(r["url"] for r in RECORDS)
    )
    again.close()


class Lazily(KeyedProcessFunction):
    """Declares its state on its first record: a subtask without records never migrates it."""

    def open(self, ctx: RuntimeContext) -> None:
        self.ctx = ctx
        self.count: Any = None

    def process(self, record: dict[str, Any], ctx: ProcessContext) -> Iterable[Any]:
        if self.count is None:
            self.count = self.ctx.get_state(ValueStateDescriptor("visits", float, default=0.0))
        self.count.update(self.count.value() + 1)
        return ()


def test_a_state_only_some_subtasks_migrated_is_refused_where_it_cannot_be_read_as_one(
    tmp_path: Path,
) -> None:
    ckpt = tmp_path / "ckpt"
    r1 = runner(RunOne, ckpt, "heap", 2)
    r1.run(RecordSource(RECORDS), max_records=100)
    r1.checkpoint()
    r1.close()
    # Run 2 sees records of subtask 0's keys only: subtask 1 never declares the state.
    ks = StrSerializer()
    first_half = [r for r in RECORDS[100:] if key_group_for_bytes(ks.serialize(r["url"]), 128) < 64]
    r2 = runner(Lazily, tmp_path / "ckpt2", "heap", 2)
    r2.restore(r1_location := str(sorted((ckpt / "job").glob("chk-*"))[-1]))
    r2.run(RecordSource(RECORDS[:100] + first_half))  # the restored position is 100
    mixed = r2.checkpoint()
    r2.close()
    assert r1_location != mixed
    with pytest.raises(StateError, match="only some subtasks declared it after its type changed"):
        SavepointReader.open(mixed).read_table("process", "visits")
    rescaled = runner(Lazily, tmp_path / "ckpt3", "heap", 3)
    with pytest.raises(StateMigrationError, match="restore at the parallelism the checkpoint was taken with"):
        rescaled.restore(mixed)
    same = runner(Lazily, tmp_path / "ckpt4", "heap", 2)
    same.restore(mixed)  # each subtask restores its own schema; declaring migrates the rest
    seen = Counter(r["url"] for r in RECORDS[:100] + first_half)
    assert contents(same, "visits", ValueStateDescriptor("visits", float, default=0.0)) == {
        k: float(n) for k, n in seen.items()
    }
