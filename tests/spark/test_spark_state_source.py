"""State as data on Spark: the ``statekit-state`` data source reads checkpoints and savepoints as DataFrames.

Every read is checked against :class:`SavepointReader` (the same rows) and
against a model of the job's input; the 1M-entry state is written straight
from a heap backend, so it costs no job run per record.
"""

from __future__ import annotations

import shutil
import tempfile
import time
from collections import Counter, defaultdict
from collections.abc import Iterable
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

from jobs import count_urls_runner, expected_counts, make_records
from statekit import (
    EventTime,
    KeyedProcessFunction,
    ListStateDescriptor,
    LocalRunner,
    MapStateDescriptor,
    ProcessContext,
    RuntimeContext,
    StateTtlConfig,
    ValueStateDescriptor,
    default_registry,
)
from statekit.backend_api import KeyedBackendParameters, KeyGroupRange
from statekit.checkpoints._writing import complete_checkpoint, write_subtask_state
from statekit.serializers import serializer_for
from statekit.snapshot_codec import CANONICAL_FORMAT
from statekit.spark import register_state_source
from statekit.spark._state_source import StateDataSource, _Options, plan_partitions, spark_schema
from statekit.state_processor import SavepointReader
from statekit.testing import ManualClock

N_RECORDS = 3000
BIG = 1_000_000


@pytest.fixture(scope="module")
def spark_src(spark: Any) -> Any:
    register_state_source(spark)
    return spark


def _read(spark: Any, location: str | None = None, **options: Any) -> Any:
    reader = spark.read.format("statekit-state")
    for k, v in options.items():
        reader = reader.option(k, str(v))
    return reader.load(location) if location is not None else reader.load()


def _rows(df: Any) -> list[dict[str, Any]]:
    return sorted((r.asDict(recursive=True) for r in df.collect()), key=_order)


def _order(row: dict[str, Any]) -> tuple[Any, ...]:
    return (row["key_group"], str(row["key"]), row.get("position", 0), str(row.get("user_key")))


@pytest.fixture(scope="module")
def url_job(tmp_path_factory: Any) -> dict[str, Any]:
    """A LocalRunner job of CountUrls: a checkpoint and a savepoint of the same state, and its input."""
    base = tmp_path_factory.mktemp("url-job")
    records = make_records(N_RECORDS)
    with count_urls_runner(str(base / "ckpts")) as runner:
        runner.run(records)
        checkpoint = runner.checkpoint()
        savepoint = runner.savepoint(str(base / "savepoints"))
        job_id = runner.job_id
    return {
        "records": records,
        "savepoint": savepoint,
        "checkpoint": checkpoint,
        "dir": str(base / "ckpts"),
        "job_id": job_id,
    }


# --- (a) a job's state, as a DataFrame ---------------------------------------------------------


def test_a_savepoint_reads_as_the_reader_and_the_model_say(spark_src: Any, url_job: dict[str, Any]) -> None:
    """Every state of the job, read through Spark, is SavepointReader's table and the model's counts."""
    records = url_job["records"]
    with SavepointReader.open(url_job["savepoint"]) as reader:
        for state in ("count", "last_methods", "bytes"):
            df = _read(spark_src, url_job["savepoint"], state=state)
            assert df.schema == spark_schema(reader.schema("process", state))
            assert _rows(df) == sorted(reader.read_table("process", state).to_pylist(), key=_order)
            assert df.rdd.getNumPartitions() >= 2  # one file per subtask at least

    counts = {r["key"]: r["value"] for r in _read(spark_src, url_job["savepoint"], state="count").collect()}
    assert Counter(counts) == expected_counts(records)
    total = {r["key"]: r["value"] for r in _read(spark_src, url_job["savepoint"], state="bytes").collect()}
    want_bytes: Counter[str] = Counter()
    methods: dict[str, list[str]] = defaultdict(list)
    for r in records:
        want_bytes[r["url"]] += r["bytes"]
        methods[r["url"]].append(r["request"])
    assert Counter(total) == want_bytes
    got_methods: dict[str, list[tuple[int, str]]] = defaultdict(list)
    for r in _read(spark_src, url_job["savepoint"], state="last_methods").collect():
        got_methods[r["key"]].append((r["position"], r["value"]))
    assert {k: [v for _, v in sorted(vs)] for k, vs in got_methods.items()} == dict(methods)


def test_a_jobs_latest_checkpoint_reads_by_checkpoints_dir_and_job_id(
    spark_src: Any, url_job: dict[str, Any]
) -> None:
    df = _read(spark_src, checkpointsDir=url_job["dir"], jobId=url_job["job_id"], state="count")
    assert Counter({r["key"]: r["value"] for r in df.collect()}) == expected_counts(url_job["records"])


def test_bad_options_fail_at_planning_naming_what_there_is(spark_src: Any, url_job: dict[str, Any]) -> None:
    with pytest.raises(Exception, match=r"no keyed state 'nope'; its states: bytes, count, last_methods"):
        _read(spark_src, url_job["savepoint"], state="nope").schema  # noqa: B018
    with pytest.raises(Exception, match=r"no operator 'nope'"):
        _read(spark_src, url_job["savepoint"], state="count", operator="nope").schema  # noqa: B018
    with pytest.raises(Exception, match=r"unknown options \['keygroup'\]"):
        _read(spark_src, url_job["savepoint"], state="count", keyGroup="1").schema  # noqa: B018
    with pytest.raises(Exception, match=r"either path .* or both checkpointsDir and jobId"):
        _read(spark_src, state="count", jobId="x").schema  # noqa: B018


# --- (b) a 1M-entry state, in several partitions -------------------------------------------------


def _big_savepoint(directory: Path, n: int) -> str:
    """A savepoint of one subtask (max parallelism 128) holding ``count`` = key % 1000 for keys 0..n-1."""
    registry = default_registry()
    backend = registry.create_backend("heap", {})
    keyed = backend.create_keyed_backend(
        KeyedBackendParameters(
            key_serializer=serializer_for(int),
            key_group_range=KeyGroupRange.of(0, 127),
            max_parallelism=128,
            local_dir=tempfile.mkdtemp(dir=directory),
        )
    )
    try:
        state = keyed.get_state(ValueStateDescriptor("count", int, default=0))
        values = iter([k % 1000 for k in range(n)])
        state.update_batch(range(n), lambda _: next(values))  # heap's SupportsBatchUpdate
        storage = registry.create_storage("filesystem", {"checkpoints-dir": str(directory / "ckpts")})
        writer = storage.begin_savepoint("big", str(directory / "savepoints"))
        sub = write_subtask_state(writer, "process", 0, keyed, None)
        return complete_checkpoint(
            writer, job_id="big", checkpoint_id=1, max_parallelism=128, subtasks=[sub], kind="savepoint"
        )
    finally:
        keyed.close()


def test_a_million_entries_read_in_several_partitions(spark_src: Any, tmp_path: Path) -> None:
    location = _big_savepoint(tmp_path, BIG)
    want_sum = sum(k % 1000 for k in range(BIG))

    started = time.monotonic()
    df = _read(spark_src, location, state="count")
    assert df.rdd.getNumPartitions() == 4  # 128 key groups of one file, at most 32 per partition
    row = df.selectExpr("count(*) AS n", "sum(value) AS s").first()
    elapsed = time.monotonic() - started
    assert (row.n, row.s) == (BIG, want_sum)
    print(f"\n1M entries, 4 partitions, count and sum: {elapsed:.1f} s")
    assert df.select("key").distinct().count() == BIG  # every key once

    df = _read(spark_src, location, state="count", partitions=3)
    assert df.rdd.getNumPartitions() == 3
    row = df.selectExpr("count(*) AS n", "sum(value) AS s").first()
    assert (row.n, row.s) == (BIG, want_sum)


# --- (c) a key-group filter reads only those key groups -------------------------------------------


def test_a_key_group_filter_plans_and_reads_only_those_blocks(
    spark_src: Any, url_job: dict[str, Any]
) -> None:
    location = url_job["savepoint"]
    with SavepointReader.open(location) as reader:
        present = {
            int(kg) for st in reader.checkpoint.metadata.operators["process"] for kg in st.keyed["offsets"]
        }
        wanted = set(range(0, 21)) | {70, 71}
        opts = _Options.parse({"path": location, "state": "count", "keyGroups": "0-20, 70-71"})
        planned = {kg for p in plan_partitions(reader, opts) for c in p.chunks for kg in c.key_groups}
        assert planned == present & wanted and planned  # no other block is planned, so none is read
        want = sorted(reader.read_table("process", "count", key_groups=wanted).to_pylist(), key=_order)

    df = _read(spark_src, location, state="count", keyGroups="0-20,70-71")
    rows = _rows(df)
    assert rows == want and rows
    assert {r["key_group"] for r in rows} <= wanted


# --- (d) a corrupt block fails the read, naming the file and key group ---------------------------


def test_a_corrupt_block_fails_the_spark_read_naming_file_and_key_group(
    spark_src: Any, url_job: dict[str, Any], tmp_path: Path
) -> None:
    location = str(tmp_path / "damaged")
    shutil.copytree(url_job["savepoint"], location)
    with SavepointReader.open(location) as reader:
        keyed = reader.checkpoint.metadata.operators["process"][0].keyed
    kg = min(int(g) for g in keyed["offsets"])
    offset, length = keyed["offsets"][str(kg)]
    path = Path(location) / keyed["handle"]["path"]
    data = bytearray(path.read_bytes())
    data[offset + length // 2] ^= 0xFF
    path.write_bytes(bytes(data))

    with pytest.raises(Exception) as failed:
        _read(spark_src, location, state="count").collect()
    message = str(failed.value)
    assert "CorruptSnapshotError" in message
    assert f"{location}/process-0.keyed: the block of key group {kg}: the bytes are not the ones" in message

    # A read that does not need the damaged block succeeds: only the blocks a partition wants are read.
    others = sorted(
        int(g) for st in reader.checkpoint.metadata.operators["process"] for g in st.keyed["offsets"]
    )
    others.remove(kg)
    df = _read(spark_src, location, state="count", keyGroups=",".join(map(str, others)))
    with SavepointReader.open(url_job["savepoint"]) as intact:
        want = intact.read_table("process", "count", key_groups=others).to_pylist()
    assert _rows(df) == sorted(want, key=_order) and want


# --- (e) timers -----------------------------------------------------------------------------------


class Timers(KeyedProcessFunction):
    """Registers an event-time timer per record (some with a namespace) and a processing-time one per key."""

    timer_namespace = str

    def open(self, ctx: RuntimeContext) -> None:
        self.seen = ctx.get_state(ValueStateDescriptor("seen", int, default=0))

    def process(self, record: dict[str, Any], ctx: ProcessContext) -> Iterable[Any]:
        self.seen.update(self.seen.value() + 1)
        ctx.timer_service.register_event_time_timer(10_000 + record["ts"])
        if record["ts"] % 3 == 0:
            ctx.timer_service.register_event_time_timer(20_000 + record["ts"], f"w{record['ts'] % 2}")
        ctx.timer_service.register_processing_time_timer(4_000_000_000_000 + record["ts"] % 5)
        return ()


def test_pending_timers_read_as_the_reader_reads_them(spark_src: Any, tmp_path: Path) -> None:
    conf = {"statekit.checkpoints.dir": str(tmp_path), "statekit.parallelism": 2}
    records = [{"k": f"k{i % 17}", "ts": i} for i in range(60)]
    with LocalRunner(Timers, key_selector=lambda r: r["k"], event_time=EventTime("ts"), config=conf) as r:
        r.run(records, max_records=len(records))  # not the end of input: no timer fires
        location = r.checkpoint()
    with SavepointReader.open(location) as reader:
        for domain in ("event-time", "processing-time"):
            want = reader.read_timers("process", domain).to_pylist()
            df = _read(spark_src, location, timers=domain)
            assert [f.name for f in df.schema] == ["key", "timestamp", "namespace", "key_group"]
            got = [r.asDict() for r in df.collect()]
            assert sorted(got, key=_timer_order) == sorted(want, key=_timer_order)
            if domain == "event-time":  # one per record, one more with a namespace for every third
                assert len(got) == 60 + 20
                assert {r["namespace"] for r in got} == {None, b"w0", b"w1"}
            else:
                assert len(got) == len({(r["k"], r["ts"] % 5) for r in records})


def _timer_order(row: dict[str, Any]) -> tuple[Any, ...]:
    return (row["key"], row["timestamp"], row["namespace"] or b"")


# --- Arrow types: maps, structs, lists, TTL timestamps; native snapshots -------------------------


PAIR_TTL = StateTtlConfig(timedelta(hours=1))


class Rich(KeyedProcessFunction):
    """A map state (rows), a dict value (an Arrow map), a TTL'd tuple (a struct), a list."""

    def open(self, ctx: RuntimeContext) -> None:
        self.by_method = ctx.get_state(MapStateDescriptor("by_method", str, int))
        self.totals = ctx.get_state(ValueStateDescriptor("totals", dict[str, int], default={}))
        self.pair = ctx.get_state(ValueStateDescriptor("pair", tuple[int, str], ttl=PAIR_TTL))
        self.sizes = ctx.get_state(ListStateDescriptor("sizes", int))

    def process(self, record: dict[str, Any], ctx: ProcessContext) -> Iterable[Any]:
        m = record["request"]
        self.by_method.put(m, (self.by_method.get(m) or 0) + 1)
        totals = dict(self.totals.value())
        totals[m] = totals.get(m, 0) + record["bytes"]
        self.totals.update(totals)
        self.pair.update((record["bytes"], m))
        self.sizes.add(record["bytes"])
        return ()


@pytest.mark.parametrize("backend", ["heap", "rocksdb"])
def test_maps_structs_lists_and_ttl_timestamps_read_as_spark_types(
    spark_src: Any, tmp_path: Path, backend: str
) -> None:
    """Checkpoints of both are native (heap's: a base and deltas): each partition restores its one
    subtask through the backend."""
    conf = {"statekit.checkpoints.dir": str(tmp_path), "statekit.parallelism": 2, "statekit.backend": backend}
    records = make_records(400, urls=20)
    with LocalRunner(Rich, key_selector=lambda r: r["url"], config=conf) as r:
        r.run(records)
        location = r.checkpoint()
    with SavepointReader.open(location) as reader:
        native = {o.id: o for o in reader.operators()}["process"].formats != (CANONICAL_FORMAT,)
        assert native
        for state in ("by_method", "totals", "pair", "sizes"):
            df = _read(spark_src, location, state=state)
            assert df.rdd.getNumPartitions() == 2  # one per subtask file
            want = reader.read_table("process", state).to_pylist()
            if state == "pair":  # Spark shows timestamps in the session's time zone: compare instants
                df = df.selectExpr("*", "unix_millis(last_access) AS ms").drop("last_access")
                for w in want:
                    w["ms"] = round(w.pop("last_access").timestamp() * 1000)
            if state == "totals":  # Arrow gives a map's entries as pairs, Spark as a dict
                for w in want:
                    w["value"] = dict(w["value"])
            assert _rows(df) == sorted(want, key=_order)

    schema = {f.name: f.dataType.simpleString() for f in _read(spark_src, location, state="pair").schema}
    assert schema == {"key": "string", "value": "struct<f0:bigint,f1:string>", "last_access": "timestamp",
                      "key_group": "int"}  # fmt: skip
    schema = {f.name: f.dataType.simpleString() for f in _read(spark_src, location, state="totals").schema}
    assert schema["value"] == "map<string,bigint>"

    last = {r["url"]: (r["bytes"], r["request"]) for r in records}
    rows = _read(spark_src, location, state="pair").collect()
    assert {r["key"]: (r["value"]["f0"], r["value"]["f1"]) for r in rows} == last
    counts: dict[tuple[str, str], int] = Counter((r["url"], r["request"]) for r in records)
    rows = _read(spark_src, location, state="by_method").collect()
    assert {(r["key"], r["user_key"]): r["value"] for r in rows} == counts
    totals: dict[str, dict[str, int]] = defaultdict(dict)
    for rec in records:
        t = totals[rec["url"]]
        t[rec["request"]] = t.get(rec["request"], 0) + rec["bytes"]
    rows = _read(spark_src, location, state="totals").collect()
    assert {r["key"]: r["value"] for r in rows} == totals


def test_expired_ttl_rows_are_left_out_unless_include_expired(spark_src: Any, tmp_path: Path) -> None:
    """Written at t = 1 s with a TTL of an hour, every ``pair`` has long expired by now."""
    conf = {"statekit.checkpoints.dir": str(tmp_path), "statekit.parallelism": 2}
    records = make_records(100, urls=10)
    with LocalRunner(Rich, key_selector=lambda r: r["url"], config=conf, clock=ManualClock(1_000)) as r:
        r.run(records)
        location = r.checkpoint()
    assert _read(spark_src, location, state="pair").count() == 0
    df = _read(spark_src, location, state="pair", includeExpired="true")
    assert {r["ms"] for r in df.selectExpr("unix_millis(last_access) AS ms").collect()} == {1_000}
    assert df.count() == len({r["url"] for r in records})


def test_a_native_partition_restores_only_its_own_subtask(tmp_path: Path, monkeypatch: Any) -> None:
    """In process, without Spark: each partition of a rocksdb checkpoint restores one subtask, once."""
    conf = {
        "statekit.checkpoints.dir": str(tmp_path),
        "statekit.parallelism": 3,
        "statekit.backend": "rocksdb",
    }
    records = make_records(300, urls=30)
    with LocalRunner(Rich, key_selector=lambda r: r["url"], config=conf) as r:
        r.run(records)
        location = r.checkpoint()
    restored: list[int] = []
    real = SavepointReader._native_part

    def spy(self: SavepointReader, operator: str, st: Any) -> Any:
        restored.append(st.subtask_index)
        return real(self, operator, st)

    monkeypatch.setattr(SavepointReader, "_native_part", spy)
    source = StateDataSource({"path": location, "state": "sizes"})
    reader = source.reader(source.schema())
    parts = reader.partitions()
    assert [[c.subtask for c in p.chunks] for p in parts] == [[0], [1], [2]]
    rows = []
    for p in parts:
        restored.clear()
        rows.extend(b.num_rows for b in reader.read(p))
        assert restored == [p.chunks[0].subtask]
    assert sum(rows) == len(records)
