"""State as data: read, query, bootstrap and rewrite savepoints, across every backend.

Round trips go through real jobs: a savepoint bootstrapped from rows is
restored by the URL count on each installed backend, and the state read back
as a table equals a plain model. Reads are checked against what the job's own
restore gives; damage is an error naming the file and key group.
"""

from __future__ import annotations

import dataclasses
from collections import Counter
from datetime import timedelta
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from jobs import make_records
from statekit import (
    KeyedProcessFunction,
    ListStateDescriptor,
    LocalRunner,
    MapStateDescriptor,
    StateTtlConfig,
    ValueStateDescriptor,
    default_registry,
)
from statekit.backend_api import PluginRegistry
from statekit.checkpointing import load_checkpoint
from statekit.errors import (
    CheckpointError,
    ConfigurationError,
    CorruptSnapshotError,
    IncompatibleSerializerError,
    StateError,
)
from statekit.state_processor import SavepointReader, SavepointWriter
from statekit_urlcount import COUNT_STATE, CountPerUrl
from test_savepoint_across_backends import INT_NS, Everything, descriptors

BACKENDS = sorted(set(default_registry().backends()) & {"heap", "rocksdb", "lmdb", "sqlite"})
BOOT = {f"/api/{i}": 100 + i for i in range(40)}


def url_runner(tmp_path: Path, backend: str, out: list[Any] | None = None, **conf: Any) -> LocalRunner:
    config = {
        "statekit.backend": backend,
        "statekit.parallelism": 2,
        "statekit.checkpoints.dir": str(tmp_path / "ck"),
        "statekit.checkpoint.storage.filesystem.inline-threshold": 0,
        "statekit.checkpoint.interval-records": 250,
        **conf,
    }
    sink = None if out is None else out.append
    return LocalRunner(CountPerUrl, key_selector=lambda r: r["url"], config=config, sink=sink)


def bootstrap(tmp_path: Path, rows: Any = None, **kw: Any) -> str:
    rows = list(BOOT.items()) if rows is None else rows
    writer = SavepointWriter.new(max_parallelism=128).with_state("process", COUNT_STATE, rows, **kw)
    return writer.write(str(tmp_path / "boot"))


def sorted_rows(t: pa.Table) -> list[str]:
    return sorted(map(repr, t.drop_columns(["key_group"]).to_pylist()))


def counts(location: str) -> dict[str, int]:
    t = SavepointReader.open(location).read_table("process", "count")
    return dict(zip(t.column("key").to_pylist(), t.column("value").to_pylist()))


@pytest.mark.parametrize("backend", BACKENDS)
def test_bootstrap_from_rows_runs_on_every_backend_and_reads_back_equal_to_the_model(
    tmp_path: Path, backend: str
) -> None:
    boot = bootstrap(tmp_path)
    records = make_records(600, urls=60, seed=3)
    outputs: list[tuple[str, int]] = []
    runner = url_runner(tmp_path, backend, outputs)
    runner.run(records, restore=boot)
    model = Counter(BOOT)
    seen: Counter[str] = Counter(BOOT)
    expected_out = []
    for r in records:
        seen[r["url"]] += 1
        expected_out.append((r["url"], seen[r["url"]]))
    assert sorted(outputs) == sorted(expected_out)  # each count continues from the bootstrap
    model.update(r["url"] for r in records)
    savepoint = runner.savepoint(str(tmp_path / "sp"))
    assert counts(savepoint) == dict(model)
    # The latest checkpoint too (a native one for rocksdb and lmdb: read through the backend).
    latest = SavepointReader.latest(str(tmp_path / "ck"), runner.job_id)
    t = latest.read_table("process", "count")
    assert dict(zip(t["key"].to_pylist(), t["value"].to_pylist())) == dict(model)
    latest.close()


def test_every_state_kind_reads_as_the_job_restores_it_and_writes_back_unchanged(tmp_path: Path) -> None:
    """Every kind of state, namespaces and TTL: read, bootstrap again, restore, compare."""
    config = {"statekit.checkpoints.dir": str(tmp_path / "ck"), "statekit.parallelism": 2}
    runner = LocalRunner(Everything, key_selector=lambda r: r[0], config=config)
    runner.run([(f"k{i % 7}", i) for i in range(50)])
    sp = runner.savepoint(str(tmp_path / "sp"))
    reader = SavepointReader.open(sp)
    op = next(o for o in reader.operators() if o.id == "process")
    assert {s.name for s in op.states} == {"value", "list", "map", "sum", "mean", "ttl", "windows"}
    tables = {s.name: reader.read_table("process", s.name, include_expired=True) for s in op.states}
    assert tables["list"].column_names == ["key", "position", "value", "key_group"]
    assert tables["map"].column_names == ["key", "user_key", "value", "key_group"]
    assert tables["windows"].column_names == ["key", "namespace", "position", "value", "key_group"]
    assert tables["ttl"].column_names == ["key", "value", "last_access", "key_group"]
    assert tables["ttl"].schema.field("last_access").type == pa.timestamp("ms", tz="UTC")
    assert tables["mean"].schema.field("value").type == pa.struct([("f0", pa.int64()), ("f1", pa.int64())])
    # Against a plain model of the job.
    value: Counter[str] = Counter()
    lists: dict[str, list[str]] = {}
    for i in range(50):
        k = f"k{i % 7}"
        value[k] += i
        lists.setdefault(k, []).append(f"{k}:{i}")
    t = tables["value"]
    assert dict(zip(t["key"].to_pylist(), t["value"].to_pylist())) == dict(value)
    got_lists: dict[str, list[tuple[int, str]]] = {}
    for row in tables["list"].to_pylist():
        got_lists.setdefault(row["key"], []).append((row["position"], row["value"]))
    assert {k: [v for _, v in sorted(x)] for k, x in got_lists.items()} == lists
    assert reader.get("process", "list", "k3") == lists["k3"]
    assert reader.get("process", "windows", "k3", namespace=1) == [
        i for i in range(50) if i % 7 == 3 and i % 4 == 1
    ]
    assert reader.get("process", "map", "k1") == {f"m{n % 3}": n for n in range(50) if n % 7 == 1}
    assert reader.get("process", "value", "nope") is None
    assert reader.read_operator_state("process", "seen").column_names == ["position", "value"]

    # Every table goes back into a new savepoint; the job restores it and saves the same state.
    d = descriptors()
    w = SavepointWriter.new(max_parallelism=128)
    for name, desc in d.items():
        w.with_state(
            "process", desc, tables[name], namespace_serializer=INT_NS if name == "windows" else None
        )
    rebuilt = w.write(str(tmp_path / "rebuilt"))
    again = LocalRunner(Everything, key_selector=lambda r: r[0], config={**config, "statekit.parallelism": 3})
    again.restore(rebuilt)
    sp2 = again.savepoint(str(tmp_path / "sp2"))
    r2 = SavepointReader.open(sp2)
    for name in d:
        b = r2.read_table("process", name, include_expired=True)
        assert sorted_rows(tables[name]) == sorted_rows(b), name


def test_filters_read_only_the_blocks_they_need_and_a_point_query_reads_one_block(tmp_path: Path) -> None:
    rows = [(f"/u/{i}", i) for i in range(5000)]
    boot = bootstrap(tmp_path, rows)
    reader = SavepointReader.open(boot)
    full = reader.read_table("process", "count")
    assert full.num_rows == 5000
    whole = reader.bytes_read
    keyed = load_checkpoint(reader.checkpoint.storage, boot).metadata.operators["process"][0].keyed
    assert keyed is not None
    assert whole >= keyed["size"]  # the whole file: header, every block, the index

    point = SavepointReader.open(boot)
    assert point.get("process", "count", "/u/1234") == 1234
    kg = full.filter(pa.compute.equal(full["key"], "/u/1234"))["key_group"][0].as_py()
    block_len = keyed["offsets"][str(kg)][1]
    # The header (read in two steps: its fixed part, then all of it) and that one block: nothing else.
    assert point.bytes_read == 14 + keyed["header_length"] + block_len
    assert point.bytes_read < whole / 50

    some = SavepointReader.open(boot)
    part = some.read_table("process", "count", key_groups=[kg, kg + 1])
    assert set(part["key_group"].to_pylist()) <= {kg, kg + 1}
    assert part.num_rows == sum(1 for g in full["key_group"].to_pylist() if g in (kg, kg + 1))
    keys = some.read_table("process", "count", keys=["/u/1", "/u/2", "/nope"])
    assert sorted(keys["key"].to_pylist()) == ["/u/1", "/u/2"]


def test_a_corrupt_block_is_an_error_naming_the_file_and_key_group_never_half_a_state(tmp_path: Path) -> None:
    boot = bootstrap(tmp_path, [(f"/u/{i}", i) for i in range(2000)])
    keyed = (
        load_checkpoint(SavepointReader.open(boot).checkpoint.storage, boot)
        .metadata.operators["process"][0]
        .keyed
    )
    assert keyed is not None
    path = Path(boot) / keyed["handle"]["path"]
    kg, (off, ln) = sorted(keyed["offsets"].items(), key=lambda x: int(x[0]))[60]
    data = bytearray(path.read_bytes())
    data[off + ln // 2] ^= 0xFF
    path.write_bytes(bytes(data))
    reader = SavepointReader.open(boot)
    with pytest.raises(CorruptSnapshotError, match=rf"{path.name}.*key group {kg}"):
        reader.read_table("process", "count")
    batches = []
    with pytest.raises(CorruptSnapshotError):
        for b in reader.read("process", "count"):
            batches.append(b)
    assert 0 < len(batches) < 128  # blocks before the damaged one came out, then the error: never silently
    # Blocks elsewhere still answer point queries.
    good = next(k for k in (f"/u/{i}" for i in range(2000)) if reader.get("process", "count", k) is not None)
    assert good


def test_native_checkpoints_need_their_backend_or_a_savepoint(tmp_path: Path, monkeypatch: Any) -> None:
    if "rocksdb" not in BACKENDS:
        pytest.skip("rocksdb is not installed")
    runner = url_runner(tmp_path, "rocksdb", **{"statekit.checkpoint.interval-records": 200})
    records = make_records(500, urls=30)
    runner.run(records)
    latest = runner.storage.latest_checkpoint(runner.job_id)
    assert latest is not None
    assert "rocksdb" in str(load_checkpoint(runner.storage, latest).metadata.backend)
    only_storage = PluginRegistry()
    from statekit_storage import _plugin

    only_storage.register_plugin(_plugin.filesystem, "statekit-storage")
    # With the backend: a point query restores only the subtask that owns the key.
    restored: list[int] = []
    real = SavepointReader._native_part
    monkeypatch.setattr(
        SavepointReader,
        "_native_part",
        lambda self, op, st: restored.append(st.subtask_index) or real(self, op, st),
    )
    model = Counter(r["url"] for r in records)
    url = records[0]["url"]
    assert SavepointReader.open(latest).get("process", "count", url) == model[url]
    assert len(restored) == 1
    reader = SavepointReader.open(latest, registry=only_storage)
    assert [o.id for o in reader.operators()]  # the metadata is read without the backend
    with pytest.raises(
        CheckpointError, match=r"native snapshot of the 'rocksdb' backend.*statekit\[rocksdb\].*savepoint"
    ):
        reader.read_table("process", "count")


def test_rewrite_renames_drops_maps_and_changes_max_parallelism_and_never_writes_into_its_source(
    tmp_path: Path,
) -> None:
    boot = bootstrap(tmp_path)
    with pytest.raises(ConfigurationError, match="inside the source"):
        SavepointWriter.from_existing(boot).write(boot + "/nested")
    w = SavepointWriter.from_existing(boot)
    w.with_state("process", ListStateDescriptor("tags", str), {"/api/1": ["a", "b"]})
    w.transform_state("process", "count", lambda n: None if n == 100 else n * 2)
    w.rename_state("process", "count", "requests")
    w.with_max_parallelism(32)
    out = w.write(str(tmp_path / "rewritten"))
    r = SavepointReader.open(out)
    assert r.max_parallelism == 32
    t = r.read_table("process", "requests")
    assert dict(zip(t["key"].to_pylist(), t["value"].to_pylist())) == {
        k: v * 2 for k, v in BOOT.items() if v != 100
    }
    assert r.get("process", "tags", "/api/1") == ["a", "b"]
    # The job restores it at the new max parallelism, with the new state name.
    renamed = ValueStateDescriptor("requests", int, default=0)

    class Requests(KeyedProcessFunction):
        def open(self, ctx: Any) -> None:
            self.n = ctx.get_state(renamed)

        def process(self, record: Any, ctx: Any) -> Any:
            self.n.update(self.n.value() + 1)
            yield (ctx.current_key, self.n.value())

    out2: list[Any] = []
    job = LocalRunner(
        Requests,
        sink=out2.append,
        key_selector=lambda r: r,
        config={
            "statekit.max-parallelism": 32,
            "statekit.parallelism": 4,
            "statekit.checkpoints.dir": str(tmp_path / "c2"),
        },
    )
    job.run(["/api/3"], restore=out)
    assert out2 == [("/api/3", 207)]
    # Dropping a state, then reading it, names what is left.
    w2 = SavepointWriter.from_existing(out).remove_state("process", "tags")
    with pytest.raises(StateError, match="has no keyed state 'tags'.*requests"):
        SavepointReader.open(w2.write(str(tmp_path / "dropped"))).read_table("process", "tags")
    # The source is untouched.
    assert counts(boot) == BOOT


def test_map_and_ttl_states_bootstrap_from_arrow_and_pandas(tmp_path: Path) -> None:
    ttl = StateTtlConfig(timedelta(minutes=10))
    tbl = pa.table(
        {
            "key": ["a", "a", "b"],
            "user_key": ["x", "y", "x"],
            "value": [1, None, 3],
            "last_access": pa.array([1_000, 2_000, 3_000], pa.int64()).cast(pa.timestamp("ms", tz="UTC")),
        }
    )
    w = SavepointWriter.new().with_state("op", MapStateDescriptor("m", str, int, ttl=ttl), tbl)
    w.with_state(
        "op",
        ValueStateDescriptor("v", float),
        tbl.select(["key"]).append_column("value", pa.array([1.5, 2.5, 3.5])).slice(1).to_pandas(),
    )
    loc = w.write(str(tmp_path / "b"))
    r = SavepointReader.open(loc)
    got = r.read_table("op", "m", include_expired=True)
    assert got.drop_columns(["key_group"]).sort_by("key").to_pylist() == tbl.sort_by("key").to_pylist()
    assert r.read_table("op", "m", now_ms=600_000 + 2_500).num_rows == 1  # only b/x is alive then
    assert r.get("op", "v", "b") == 3.5
    with pytest.raises(StateError, match="appears twice"):
        SavepointWriter.new().with_state("op", ValueStateDescriptor("v", int), [("a", 1), ("a", 2)])
    with pytest.raises(StateError, match="lacks columns"):
        SavepointWriter.new().with_state(
            "op", MapStateDescriptor("m", str, int), pa.table({"key": ["a"], "value": [1]})
        )


def test_savepoints_on_s3_are_written_read_and_queried_through_storage_options(
    tmp_path: Path, s3_endpoint: dict[str, str]
) -> None:
    options = {"client_kwargs": {"endpoint_url": s3_endpoint["endpoint_url"]}}
    target = f"s3://{s3_endpoint['bucket']}/state-as-data/{tmp_path.name}"
    w = SavepointWriter.new().with_state("process", COUNT_STATE, BOOT)
    location = w.write(target, storage_options=options)
    assert location.startswith("s3://")
    reader = SavepointReader.open(location, storage_options=options)
    t = reader.read_table("process", "count")
    assert dict(zip(t["key"].to_pylist(), t["value"].to_pylist())) == BOOT
    point = SavepointReader.open(location, storage_options=options)
    assert point.get("process", "count", "/api/7") == 107
    assert point.bytes_read < reader.bytes_read / 4  # the header and one of the blocks


@dataclasses.dataclass(frozen=True)
class Seen:
    """The migrated count: the count and the hour it was first seen."""

    count: int
    first_hour: int


def test_a_states_type_migrates_through_a_rewrite_and_the_new_job_restores_it(tmp_path: Path) -> None:
    boot = bootstrap(tmp_path)
    new = ValueStateDescriptor("count", Seen)
    old = LocalRunner(
        SeenCount, key_selector=lambda r: r, config={"statekit.checkpoints.dir": str(tmp_path / "x")}
    )
    with pytest.raises(IncompatibleSerializerError):  # the old savepoint does not restore into the new type
        old.run(["/api/4"], restore=boot)
    migrated = (
        SavepointWriter.from_existing(boot)
        .transform_state("process", "count", lambda n: Seen(n, 0), descriptor=new)
        .write(str(tmp_path / "migrated"))
    )
    t = SavepointReader.open(migrated).read_table("process", "count")
    assert t.schema.field("value").type == pa.struct([("count", pa.int64()), ("first_hour", pa.int64())])
    out: list[Any] = []
    job = LocalRunner(
        SeenCount,
        key_selector=lambda r: r,
        sink=out.append,
        config={"statekit.checkpoints.dir": str(tmp_path / "y")},
    )
    job.run(["/api/4", "/api/new"], restore=migrated)
    assert out == [("/api/4", Seen(105, 0)), ("/api/new", Seen(1, 0))]


class SeenCount(KeyedProcessFunction):
    def open(self, ctx: Any) -> None:
        self.seen = ctx.get_state(ValueStateDescriptor("count", Seen))

    def process(self, record: Any, ctx: Any) -> Any:
        old = self.seen.value() or Seen(0, 0)
        self.seen.update(Seen(old.count + 1, old.first_hour))
        yield (ctx.current_key, self.seen.value())
