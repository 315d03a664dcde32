"""The executor side without Spark: a task reuses cached state only when it is exactly the checkpoint's."""

from __future__ import annotations

import dataclasses
import json
import uuid
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from pyspark.sql import types as T

from jobs import CountUrls, CountUrlsBatch, CountUrlsColumns, make_records, model_state, state_of_runner
from statekit import ColumnsContext, Configuration, LocalRunner, ProcessContext
from statekit.checkpoints._metadata import SubtaskState
from statekit.checkpoints._writing import complete_checkpoint
from statekit.errors import CheckpointError
from statekit.serialization._keygroups import key_group_for_bytes
from statekit.serializers import StrSerializer
from statekit.spark import _loops
from statekit.spark._driver import ATTEMPTS_PROPERTY, TOKEN_PROPERTY
from statekit.spark._output import FLUSH_ROWS, TaskOutput
from statekit.spark._plan import (
    HANDLE_COLUMN,
    InlineMetadata,
    StoredMetadata,
    TaskPlan,
    batch_plan,
    batch_property,
)
from statekit.spark._routing import KEY_GROUP_COLUMN, MARKER_COLUMN, SUBTASK_COLUMN
from statekit.spark._task import make_task, reset_cache
from statekit_storage import FileSystemCheckpointStorage

RECORDS = make_records(600)
COLUMNS = ("url", "request", "bytes")
INPUT = pa.schema([("url", pa.string()), ("request", pa.string()), ("bytes", pa.int64()),
                   (SUBTASK_COLUMN, pa.int32()), (MARKER_COLUMN, pa.bool_())])  # fmt: skip
#: INPUT with the key group column Spark's routing adds.
ROUTED = pa.schema([*INPUT, (KEY_GROUP_COLUMN, pa.int32())])
OUTPUT = T.StructType([T.StructField("url", T.StringType()), T.StructField("n", T.LongType())])


class _Broadcast:
    def __init__(self, value: bytes) -> None:
        self.value = value


class FailOnce(CountUrls):
    """Once armed, fails at the third record it sees: after it changed the state of two."""

    countdown = 0

    def process(self, record: dict[str, Any], ctx: ProcessContext) -> Iterable[Any]:
        if FailOnce.countdown > 0:
            FailOnce.countdown -= 1
            if FailOnce.countdown == 0:
                raise RuntimeError("injected")
        return super().process(record, ctx)


class FailOnceBatch(CountUrlsBatch):
    """Once armed, fails at the third key it sees: after it changed the state of two."""

    countdown = 0

    def process_batch(self, rows: Any, ctx: ProcessContext) -> Any:
        if FailOnceBatch.countdown > 0:
            FailOnceBatch.countdown -= 1
            if FailOnceBatch.countdown == 0:
                raise RuntimeError("injected")
        return super().process_batch(rows, ctx)


class CountUrlsColumnsCalls(CountUrlsColumns):
    """CountUrlsColumns that records how many rows each call got; once armed, fails at its second call."""

    calls: list[int] = []
    countdown = 0

    def process_columns(self, rows: Any, keys: list[Any], ctx: ColumnsContext) -> Any:
        assert rows.num_rows == len(keys) and rows.column("url").to_pylist() == keys
        CountUrlsColumnsCalls.calls.append(len(keys))
        out = super().process_columns(rows, keys, ctx)
        if CountUrlsColumnsCalls.countdown > 0:
            CountUrlsColumnsCalls.countdown -= 1
            if CountUrlsColumnsCalls.countdown == 0:
                raise RuntimeError("injected")  # after this call changed the state
        return out


class StopOnce(CountUrls):
    """Once armed, stops its own process (SIGSTOP) at the third record it sees: a hung worker."""

    countdown = 0

    def process(self, record: dict[str, Any], ctx: ProcessContext) -> Iterable[Any]:
        if StopOnce.countdown > 0:
            StopOnce.countdown -= 1
            if StopOnce.countdown == 0:
                import signal
                import threading

                # To this thread, so it stops here and now (to the process, the kernel may let it
                # run on for a while on a busy machine: long enough to finish the task).
                signal.pthread_kill(threading.get_ident(), signal.SIGSTOP)
        return super().process(record, ctx)


class Driver:
    """Plays the driver of one subtask: plans tasks, completes checkpoints."""

    def __init__(
        self,
        tmp_path: Path,
        function: Any = CountUrls,
        *,
        vectorized: bool = False,
        columns: bool = False,
        config: dict[str, Any] | None = None,
        local_dir: str | None = None,
        job_id: str = "unit",
    ) -> None:
        self.job_id = job_id
        self.vectorized = vectorized or columns
        self.columns = columns
        self.chunks = 1  # the Arrow batches a task's rows arrive in
        self.marker = True  # a marker row after the records (per-batch routing); False: as in the plan
        self.key_groups = False  # each row with its key group, as Spark's routing sends it
        self.local_dir = local_dir or str(tmp_path / "executor")  # one executor's local directory
        self.config = config or {}
        self.dir = str(tmp_path / "ckpt")
        self.storage = FileSystemCheckpointStorage(self.dir)
        self.function = function
        self.latest: tuple[str, str, dict[int, str]] | None = None  # location, token, attempts
        self.next_id = 1

    def plan(self, *, run_id: str = "run-1") -> TaskPlan:
        return TaskPlan(
            job_id=self.job_id, operator_id="process", run_id=run_id, checkpoint_id=self.next_id,
            token=uuid.uuid4().hex, restore_location=self.latest[0] if self.latest else None,
            restore_token=self.latest[1] if self.latest else None,
            restore_attempts=self.latest[2] if self.latest else {}, parallelism=1, max_parallelism=128,
            config=Configuration({"statekit.checkpoints.dir": self.dir, "statekit.local-dir": self.local_dir,
                                  **self.config}), function_factory=self.function,
            key_column="url", key_serializer=StrSerializer(), input_columns=COLUMNS, output_schema=OUTPUT,
            vectorized=self.vectorized, columns=self.columns,
        )  # fmt: skip

    def run_task(self, plan: TaskPlan, records: list[dict[str, Any]]) -> tuple[list[Any], dict[str, Any]]:
        rows = [{**{c: r[c] for c in COLUMNS}, SUBTASK_COLUMN: 0, MARKER_COLUMN: False} for r in records]
        if self.marker:
            rows.append({"url": None, "request": None, "bytes": None, SUBTASK_COLUMN: 0, MARKER_COLUMN: True})
        metadata = _Broadcast(
            self.storage.read_metadata(plan.restore_location) if plan.restore_location else b""
        )
        if self.key_groups:
            keys = StrSerializer()
            for row in rows:
                url = row["url"]
                row[KEY_GROUP_COLUMN] = None if url is None else key_group_for_bytes(keys.serialize(url), 128)
        size = -(-len(rows) // self.chunks)
        schema = ROUTED if self.key_groups else INPUT
        batches = [
            pa.RecordBatch.from_pylist(rows[i : i + size], schema=schema) for i in range(0, len(rows), size)
        ]
        out = list(make_task(plan, metadata)(iter(batches)))
        table = pa.Table.from_batches(out)
        handles = [json.loads(h) for h in table.column(HANDLE_COLUMN).to_pylist() if h is not None]
        outputs = [
            (u, n) for u, n, h in zip(*(table.column(c).to_pylist() for c in table.column_names)) if h is None
        ]
        assert len(handles) == 1
        return outputs, handles[0]

    def complete(self, plan: TaskPlan, report: dict[str, Any]) -> None:
        location = complete_checkpoint(
            self.storage.begin_checkpoint(self.job_id, plan.checkpoint_id), job_id=self.job_id,
            checkpoint_id=plan.checkpoint_id, max_parallelism=128,
            subtasks=[SubtaskState.from_json(report["state"])],
            properties={TOKEN_PROPERTY: plan.token, ATTEMPTS_PROPERTY: {"0": report["attempt"]}},
        )  # fmt: skip
        self.latest = (location, plan.token, {0: report["attempt"]})
        self.next_id += 1

    def batch(self, records: list[dict[str, Any]], **kw: Any) -> dict[str, Any]:
        plan = self.plan(**kw)
        outputs, report = self.run_task(plan, records)
        assert len(outputs) == len(records) == report["records"]
        self.complete(plan, report)
        return report

    def state(self) -> dict[str, Any]:
        runner = LocalRunner(
            CountUrls, key_selector=lambda r: r["url"], storage=self.storage, job_id=self.job_id
        )
        runner.restore(self.latest[0] if self.latest else "latest")
        return state_of_runner(runner)


@pytest.fixture(autouse=True)
def _fresh_cache() -> Any:
    reset_cache()
    FailOnce.countdown = FailOnceBatch.countdown = StopOnce.countdown = CountUrlsColumnsCalls.countdown = 0
    CountUrlsColumnsCalls.calls = []
    yield
    reset_cache()


def test_the_next_batch_reuses_state_that_is_exactly_the_checkpoint(tmp_path: Path) -> None:
    driver = Driver(tmp_path)
    assert driver.batch(RECORDS[:300])["reused"] is False
    assert driver.batch(RECORDS[300:])["reused"] is True
    assert driver.state() == model_state(RECORDS)


def test_state_of_a_batch_that_did_not_complete_is_never_reused(tmp_path: Path) -> None:
    driver = Driver(tmp_path)
    driver.batch(RECORDS[:300])
    # The task succeeds and caches its state, but the batch does not complete (say the sink failed).
    driver.run_task(driver.plan(), RECORDS[300:])
    report = driver.batch(RECORDS[300:])  # the batch again, from the last completed checkpoint
    assert report["reused"] is False
    assert driver.state() == model_state(RECORDS)


def test_a_task_that_fails_midway_leaves_nothing_behind(tmp_path: Path) -> None:
    driver = Driver(tmp_path, function=FailOnce)
    driver.batch(RECORDS[:300])
    FailOnce.countdown = 3
    plan = driver.plan()
    with pytest.raises(RuntimeError, match="injected"):
        driver.run_task(plan, RECORDS[300:])
    outputs, report = driver.run_task(plan, RECORDS[300:])  # the retried attempt
    assert report["reused"] is False and len(outputs) == 300
    driver.complete(plan, report)
    assert driver.state() == model_state(RECORDS)


def _outputs_in_two_parts(driver: Driver) -> list[list[Any]]:
    """``RECORDS`` in two batches through ``driver``'s tasks: each batch's outputs, sorted."""
    got = []
    for part in (RECORDS[:300], RECORDS[300:]):
        plan = driver.plan()
        out, report = driver.run_task(plan, part)
        assert report["records"] == report["outputs"] == len(part)
        driver.complete(plan, report)
        got.append(sorted(out))
    assert report["reused"] is True
    return got


def test_a_batch_function_gets_each_key_once_with_the_per_record_outcome(tmp_path: Path) -> None:
    outputs = _outputs_in_two_parts
    want = outputs(Driver(tmp_path / "a"))
    reset_cache()  # the two drivers' subtasks have the same cache key
    vectorized = Driver(tmp_path / "b", CountUrlsBatch, vectorized=True)
    assert outputs(vectorized) == want
    assert vectorized.state() == model_state(RECORDS)


@pytest.mark.parametrize("form", ["batch", "columns"])
def test_a_batch_or_columns_function_task_that_fails_midway_leaves_nothing_behind(
    tmp_path: Path, form: str
) -> None:
    if form == "batch":
        driver = Driver(tmp_path, FailOnceBatch, vectorized=True)
    else:
        driver = Driver(tmp_path, CountUrlsColumnsCalls, columns=True)
        driver.chunks = 3
    driver.batch(RECORDS[:300])
    if form == "batch":
        FailOnceBatch.countdown = 3
    else:
        CountUrlsColumnsCalls.countdown = 2
    plan = driver.plan()
    with pytest.raises(RuntimeError, match="injected"):
        driver.run_task(plan, RECORDS[300:])
    outputs, report = driver.run_task(plan, RECORDS[300:])
    assert report["reused"] is False and len(outputs) == 300
    driver.complete(plan, report)
    assert driver.state() == model_state(RECORDS)


def test_a_columns_function_gets_each_arriving_batch_with_the_per_record_outcome(tmp_path: Path) -> None:
    want_out = _outputs_in_two_parts(Driver(tmp_path / "a"))
    reset_cache()  # the two drivers' subtasks have the same cache key
    driver = Driver(tmp_path / "b", CountUrlsColumnsCalls, columns=True)
    driver.chunks = 4  # 301 rows (the last a marker) in four Arrow batches: 76, 76, 76, 73
    got = _outputs_in_two_parts(driver)
    # A call per arriving batch, the marker row left out of the last.
    assert CountUrlsColumnsCalls.calls == [76, 76, 76, 72] * 2
    assert got == want_out
    assert driver.state() == model_state(RECORDS)


def two_batches(records: list[dict[str, Any]], driver: Driver) -> list[tuple[list[Any], dict[str, Any]]]:
    """Two micro-batches of ``records`` (split at FLUSH_ROWS) through ``driver``: outputs and counts."""
    got = []
    for part in (records[:FLUSH_ROWS], records[FLUSH_ROWS:]):
        plan = driver.plan()
        out, report = driver.run_task(plan, part)
        driver.complete(plan, report)
        got.append((out, {k: report[k] for k in ("records", "outputs", "late")}))
    assert driver.state() == model_state(records)
    return got


@pytest.mark.parametrize("width", [1, 3])
def test_rows_of_a_batch_are_arrow_s_rows_with_an_unconvertible_value_in_its_place(width: int) -> None:
    """The records a per-record function gets: Arrow's own rows (one column: built apart, faster), and
    where a value has no Python form, its row holds an Unconvertible naming it and the batch says so."""
    from statekit.spark._arrow_values import Unconvertible, rows_of

    late = 6_307_200_000_000_000_000  # microseconds: past the year 9999, no datetime holds it
    columns = {
        "at": pa.array([0, 7, 5, None], pa.timestamp("us")),
        "url": pa.array(["/a", None, "/b", "/a"]),
        "n": pa.array([1, 2, None, 4], pa.int64()),
    }
    names = list(columns)[:width]
    batch = pa.RecordBatch.from_pydict({name: columns[name] for name in names})
    rows, whole = rows_of(batch)
    assert (rows, whole) == (batch.to_pylist(), True)
    assert rows == [dict(zip(names, values)) for values in zip(*(columns[n].to_pylist() for n in names))]

    columns["at"] = pa.array([0, late, 5, None], pa.timestamp("us"))
    rows, whole = rows_of(pa.RecordBatch.from_pydict({name: columns[name] for name in names}))
    assert not whole and len(rows) == 4 and [list(r) for r in rows] == [names] * 4
    bad = rows[1]["at"]
    assert isinstance(bad, Unconvertible) and f"{late} (timestamp[us])" in repr(bad), bad
    assert [rows[i]["at"] for i in (0, 2, 3)] == [columns["at"][i].as_py() for i in (0, 2, 3)]
    if width == 3:
        assert [(r["url"], r["n"]) for r in rows] == [("/a", 1), (None, 2), ("/b", None), ("/a", 4)]


def test_rows_of_one_subtask_take_the_short_loop_with_the_general_loop_s_outcome(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Arrow batches of one subtask's records and no marker (the routing in the query's plan) run a
    shorter per-record loop: the same outputs in the same order, the same counts, the same state."""
    records = make_records(2 * FLUSH_ROWS + 300)  # the outputs are flushed twice within the batch

    short: list[int] = []
    original = _loops._records_of_one_subtask

    def counted(run: Any, batch: Any, index: int, started: float) -> Any:
        short.append(batch.num_rows)
        return original(run, batch, index, started)

    monkeypatch.setattr(_loops, "_records_of_one_subtask", counted)
    want = two_batches(records, Driver(tmp_path / "general"))  # a marker row in every batch: the general loop
    assert short == []
    for chunks in (1, 3):
        reset_cache()  # the drivers' subtasks have the same cache key
        driver = Driver(tmp_path / f"short-{chunks}")
        driver.marker, driver.chunks = False, chunks
        assert two_batches(records, driver) == want
        assert sum(short) == len(records) and len(short) == 2 * chunks
        short.clear()
    assert [r["records"] for _, r in want] == [FLUSH_ROWS, FLUSH_ROWS + 300]


def test_a_batch_function_s_rows_of_one_subtask_are_grouped_by_arrow_with_the_general_outcome(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A KeyedBatchFunction's batch of one subtask's records and no marker is grouped by key in Arrow,
    in one or several arriving chunks, with or without the routing's key groups: the same outputs in
    the same order, the same counts and state as the general loop's grouping in Python."""
    records = make_records(2 * FLUSH_ROWS + 300)
    by_arrow: list[bool] = []
    original = _loops._grouped_by_arrow

    def counted(run: Any, batch: Any) -> Any:
        grouped = original(run, batch)
        by_arrow.append(grouped is not None)
        return grouped

    monkeypatch.setattr(_loops, "_grouped_by_arrow", counted)
    want = two_batches(records, Driver(tmp_path / "general", CountUrlsBatch, vectorized=True))
    assert by_arrow == [False, False]  # a marker row in every batch: grouped in Python
    for chunks, key_groups in ((1, False), (3, True)):
        by_arrow.clear()
        reset_cache()  # the drivers' subtasks have the same cache key
        driver = Driver(tmp_path / f"arrow-{chunks}", CountUrlsBatch, vectorized=True)
        driver.marker, driver.chunks, driver.key_groups = False, chunks, key_groups
        assert two_batches(records, driver) == want
        assert by_arrow == [True, True]
    assert [r["records"] for _, r in want] == [FLUSH_ROWS, FLUSH_ROWS + 300]


def test_columns_of_one_subtask_skip_the_per_row_routing_with_the_same_outcome(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A KeyedColumnsFunction's Arrow batches of one subtask's records and no marker are told so by
    Arrow: no per-row subtask and marker lists, the same outputs, counts and state."""
    records = make_records(2 * FLUSH_ROWS + 300)

    routed: list[int] = []
    original = _loops._routed_rows

    def counted(run: Any, batch: Any) -> Any:
        routed.append(batch.num_rows)
        return original(run, batch)

    monkeypatch.setattr(_loops, "_routed_rows", counted)
    general = Driver(tmp_path / "general", CountUrlsColumns, columns=True)  # a marker row in every batch
    want = two_batches(records, general)
    assert routed
    for chunks in (1, 3):
        routed.clear()
        reset_cache()
        driver = Driver(tmp_path / f"short-{chunks}", CountUrlsColumns, columns=True)
        driver.marker, driver.chunks = False, chunks
        assert two_batches(records, driver) == want
        assert routed == []
    assert [r["records"] for _, r in want] == [FLUSH_ROWS, FLUSH_ROWS + 300]


class RenamingColumns(CountUrlsColumns):
    """Rewrites the keys list it gets in place (after counting) and returns that list as the URLs."""

    def process_columns(self, rows: Any, keys: list[Any], ctx: ColumnsContext) -> Any:
        out = super().process_columns(rows, keys, ctx)
        keys[0] = keys[-1] = "renamed"
        return out


def _running_counts(records: list[dict[str, Any]]) -> list[int]:
    """Each record's URL count so far, as CountUrls emits it."""
    seen: dict[str, int] = {}
    out = []
    for r in records:
        seen[r["url"]] = n = seen.get(r["url"], 0) + 1
        out.append(n)
    return out


@pytest.mark.parametrize("key_groups", [False, True])
def test_keys_a_columns_function_returns_as_they_came_are_emitted_from_arrow_and_changed_ones_as_changed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, key_groups: bool
) -> None:
    """Its keys list returned unchanged is the batch's own Arrow key column in the output (no conversion
    back); one rewritten in place since the call is emitted as rewritten."""
    records = make_records(500)
    taken: list[bool] = []
    original = _loops._keys_back

    def spied(result: dict[str, Any], *args: Any) -> dict[str, Any]:
        back = original(result, *args)
        taken.append(back is not result)
        return back

    monkeypatch.setattr(_loops, "_keys_back", spied)
    for function, urls in (
        (CountUrlsColumns, [r["url"] for r in records]),
        (RenamingColumns, ["renamed", *(r["url"] for r in records[1:-1]), "renamed"]),
    ):
        reset_cache()
        taken.clear()
        driver = Driver(tmp_path / function.__name__, function, columns=True)
        driver.marker, driver.key_groups = False, key_groups
        plan = driver.plan()
        out, report = driver.run_task(plan, records)
        assert [u for u, _ in out] == urls
        assert [n for _, n in out] == _running_counts(records)
        assert taken == [function is CountUrlsColumns]
        driver.complete(plan, report)
        assert driver.state() == model_state(records)


@pytest.mark.parametrize("form", ["records", "batch", "columns"])
def test_a_task_takes_the_key_groups_the_routing_computed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, form: str
) -> None:
    """Rows that come with their key group (the routing in the query's plan): the backend computes
    none of the keys' groups again, with the same outputs, counts and state."""
    from statekit.state import _keyed

    function = {"records": CountUrls, "batch": CountUrlsBatch, "columns": CountUrlsColumns}[form]
    kw = {"vectorized": form == "batch", "columns": form == "columns"}
    records = make_records(2 * FLUSH_ROWS + 300)
    want = two_batches(records, Driver(tmp_path / "computed", function, **kw))
    hashed: list[bytes] = []  # by the tasks (the state read back after them computes its own)
    in_task = [False]

    def counted(raw: bytes, max_parallelism: int) -> int:
        if in_task[0]:
            hashed.append(raw)
        return key_group_for_bytes(raw, max_parallelism)

    monkeypatch.setattr(_keyed, "key_group_for_bytes", counted)
    switches = [0]  # keys made current by set_current_key in the tasks
    base_switch = _keyed.KeyedBackendBase.set_current_key

    def switch(self: Any, key: Any) -> None:
        switches[0] += in_task[0]
        base_switch(self, key)

    monkeypatch.setattr(_keyed.KeyedBackendBase, "set_current_key", switch)
    for marker in (False, True):  # rows of one subtask alone, then with a marker (the general loops)
        reset_cache()
        driver = Driver(tmp_path / f"routed-{marker}", function, **kw)
        driver.marker, driver.key_groups = marker, True
        run_task = driver.run_task

        def in_a_task(plan: TaskPlan, rows: list[dict[str, Any]], run_task: Any = run_task) -> Any:
            in_task[0] = True
            try:
                return run_task(plan, rows)
            finally:
                in_task[0] = False

        driver.run_task = in_a_task  # type: ignore[method-assign]
        hashed.clear()
        switches[0] = 0
        assert two_batches(records, driver) == want
        if not marker:
            assert hashed == []
            # The per-record loop makes each key current with its group (hand_over_key_groups).
            assert (switches[0] == 0) == (form == "records")
        else:  # the general loops compute them as before
            assert len(set(hashed)) == len({r["url"] for r in records})


def test_a_backend_with_its_own_key_switch_sees_every_key_of_routed_rows(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Rows of one subtask with their key groups make each key current through the backend's own
    set_current_key when its class replaces the base's (the key groups are then only remembered)."""
    from statekit_heap import HeapKeyedStateBackend

    records = make_records(FLUSH_ROWS + 300)
    want = two_batches(records, Driver(tmp_path / "plain"))
    switched: list[Any] = []
    base_switch = HeapKeyedStateBackend.set_current_key

    def watching(self: HeapKeyedStateBackend, key: Any) -> None:
        switched.append(key)
        base_switch(self, key)

    monkeypatch.setattr(HeapKeyedStateBackend, "set_current_key", watching)
    reset_cache()
    driver = Driver(tmp_path / "watched")
    driver.marker, driver.key_groups = False, True
    assert two_batches(records, driver) == want
    assert switched[: len(records)] == [r["url"] for r in records]


def test_a_backend_with_its_own_switch_in_group_is_called_for_every_routed_row(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The per-record loop makes a routed row's key current with the base's two writes itself; a class
    that replaces set_current_key_in_group is called instead, for every row, in order."""
    from statekit_heap import HeapKeyedStateBackend

    records = make_records(FLUSH_ROWS + 300)
    want = two_batches(records, Driver(tmp_path / "plain"))
    switched: list[Any] = []
    base_switch = HeapKeyedStateBackend.set_current_key_in_group

    def watching(self: HeapKeyedStateBackend, key: Any, key_group: int) -> None:
        switched.append((key, key_group))
        base_switch(self, key, key_group)

    monkeypatch.setattr(HeapKeyedStateBackend, "set_current_key_in_group", watching)
    reset_cache()
    driver = Driver(tmp_path / "watched")
    driver.marker, driver.key_groups = False, True
    assert two_batches(records, driver) == want
    assert [key for key, _ in switched] == [r["url"] for r in records]
    assert all(group == key_group_for_bytes(key.encode(), 128) for key, group in switched)


def test_only_the_attempt_whose_snapshot_completed_is_reused(tmp_path: Path) -> None:
    """Two attempts of one task may both succeed (speculation, zombie tasks): one of them is checkpointed."""
    driver = Driver(tmp_path)
    driver.batch(RECORDS[:300])
    plan = driver.plan()
    _, checkpointed = driver.run_task(plan, RECORDS[300:])
    driver.run_task(plan, RECORDS[300:])  # the other attempt: its state is what this worker keeps
    driver.complete(plan, checkpointed)
    assert driver.batch([])["reused"] is False
    assert driver.state() == model_state(RECORDS)


def test_another_query_run_reuses_open_state_that_is_exactly_its_restore(tmp_path: Path) -> None:
    """Issue 46: a restarted query finds its subtask open at the checkpoint it restores (as Spark's own
    store finds its instance loaded at that version), made for the same plan: reused, exact."""
    driver = Driver(tmp_path)
    driver.batch(RECORDS[:300], run_id="run-1")
    assert driver.batch(RECORDS[300:], run_id="run-2")["reused"] is True
    assert driver.state() == model_state(RECORDS)


def test_another_query_run_with_another_configuration_never_reuses(tmp_path: Path) -> None:
    driver = Driver(tmp_path)
    driver.batch(RECORDS[:300], run_id="run-1")
    driver.config = {**driver.config, "statekit.key-cache-size": 1024}  # a restart with other settings
    assert driver.batch(RECORDS[300:], run_id="run-2")["reused"] is False
    assert driver.state() == model_state(RECORDS)


def test_two_jobs_in_one_worker_count_entries_or_not_as_each_job_s_configuration_says(tmp_path: Path) -> None:
    """spark.statekit.metrics.exact-entries reaches the task's backend, per job: a reused Python worker
    holding both jobs' subtasks keeps each setting apart (issue 43)."""
    pytest.importorskip("statekit_rocksdb")
    from statekit.runtime._metrics import checkpoint_stats
    from statekit.spark._cache import _CACHE

    exact = Driver(tmp_path / "a", config={"statekit.backend": "rocksdb"}, job_id="exact")
    estimate = Driver(
        tmp_path / "b",
        config={"statekit.backend": "rocksdb", "spark.statekit.metrics.exact-entries": "false"},
        job_id="estimate",
    )
    for records in (RECORDS[:300], RECORDS[300:]):  # interleaved, in this one process
        reports = {d.job_id: d.batch(records) for d in (exact, estimate)}
    urls = len(model_state(RECORDS))
    stats = {j: checkpoint_stats(1, [SubtaskState.from_json(r["state"])]) for j, r in reports.items()}
    # Three keyed states per URL (count, methods, bytes), each counted exactly.
    assert stats["exact"].state_entries_exact and stats["exact"].state_entries == 3 * urls
    assert not stats["estimate"].state_entries_exact  # the engine's estimate, labelled
    counting = {job: held.subtask.keyed.kv_counts.enabled for (job, _, _), held in _CACHE.items()}
    assert counting == {"exact": True, "estimate": False}


def test_output_records_are_tuples_rows_dicts_or_single_values() -> None:
    from pyspark.sql import Row

    plan = Driver(Path("/nonexistent")).plan()
    out = TaskOutput(plan)
    for record in [("a", 1), ["b", 2], Row(url="c", n=3), {"url": "d", "n": 4}, {"n": 5}]:
        out.add(record)
    batch = out.flush()
    assert batch.column("url").to_pylist() == ["a", "b", "c", "d", None]
    assert batch.column("n").to_pylist() == [1, 2, 3, 4, 5]
    with pytest.raises(ValueError, match="3 fields"):
        out.add(("a", 1, 2))
    with pytest.raises(ValueError, match="lacks"):
        out.add({"url": "a", "count": 1})
    with pytest.raises(TypeError, match="tuples"):
        out.add("just a string")
    out.add(("a", "not a number"))
    with pytest.raises(TypeError, match="output column 'n'"):
        out.flush()


def test_output_columns_and_records_keep_their_order() -> None:
    import numpy as np
    import pandas as pd

    out = TaskOutput(Driver(Path("/nonexistent")).plan())
    assert out.add_columns({"url": ["a", "b"], "n": range(1, 3)}) == 2
    out.add(("c", 3))
    out.add_columns(pa.record_batch({"n": pa.array([4, 5], pa.int32()), "url": ["d", "e"]}))
    out.add_columns({"url": ["f"], "n": [6]})
    out.add_columns(pd.DataFrame({"url": ["g", "h"], "n": np.array([7, 8])}))
    out.add_columns({"n": [9]})  # a missing column is null
    assert out.add_result([("i", 10)]) == 1
    assert out.add_columns({"url": [], "n": []}) == 0
    assert out.size == 10
    batch = out.flush()
    assert batch.column("url").to_pylist() == [*"abcdefgh", None, "i"]
    assert batch.column("n").to_pylist() == list(range(1, 11)) and batch.schema == out.schema
    assert out.size == 0 and out.flush().num_rows == 0
    with pytest.raises(ValueError, match=r"columns \['count'\] that the output schema lacks"):
        out.add_columns({"url": ["a"], "count": [1]})
    with pytest.raises(TypeError, match="returns a pyarrow RecordBatch"):
        out.add_columns([("a", 1)])
    with pytest.raises(TypeError, match="output column 'n'"):
        out.add_columns({"url": pa.array(["a"]), "n": pa.array(["x"])})


class _Values(list):  # type: ignore[type-arg]  # a list subclass: the general path's, not the one-pass one
    pass


@pytest.mark.parametrize(
    "result",
    [
        {"url": ["a", "b"], "n": range(1, 3)},
        {"n": (1, 2), "url": ["a", "b"]},  # another order
        {"url": ["a", "b"], "n": None},  # a column given as None is null
        {"n": [1, 2]},  # a missing column is null
        {"url": _Values(["a", "b"]), "n": [1, 2]},
        {"url": ["a"], "n": [1, 2]},  # lengths differ: an error
        {"url": ["a"], "count": [1]},  # a column the schema lacks: an error
        {"url": None, "n": None},
        {},
        {"url": [], "n": []},
    ],
)
def test_a_dict_of_python_columns_is_added_as_the_general_path_adds_it(result: dict[str, Any]) -> None:
    """The one-pass way of a dict output, against ``output_columns`` and the per-column extension."""
    plan = Driver(Path("/nonexistent")).plan()
    fast, general = TaskOutput(plan), TaskOutput(plan)
    for out in (fast, general):
        out.add(("x", 0))  # pending records first: a column output comes after them

    def outcome(add: Any) -> Any:
        try:
            return add()
        except (ValueError, TypeError) as e:
            return type(e), str(e)

    got = outcome(lambda: fast.add_columns(result))
    want = outcome(lambda: general.add_columns(_NotADict(result)))
    assert got == want
    if isinstance(got, int):
        a, b = fast.flush(), general.flush()
        assert a.equals(b), (a.to_pydict(), b.to_pydict())


class _NotADict(dict):  # type: ignore[type-arg]  # a dict subclass: add_columns takes the general path
    pass


def test_modules_executors_cannot_import_are_shipped_by_value(tmp_path: Path) -> None:
    import functools
    import importlib.util
    import sys

    from pyspark import cloudpickle

    from statekit.spark._shipping import ship_by_value
    from statekit_heap import HeapStateBackend

    source = tmp_path / "my_local_job.py"
    source.write_text("from jobs import CountUrls\n\nclass MyJob(CountUrls):\n    pass\n")
    spec = importlib.util.spec_from_file_location("my_local_job", source)
    module = importlib.util.module_from_spec(spec)
    sys.modules["my_local_job"] = module
    spec.loader.exec_module(module)
    try:
        shipped = ship_by_value(functools.partial(module.MyJob))
        assert shipped == ["my_local_job", "jobs"]  # the class and its base class, not statekit's
        assert ship_by_value(HeapStateBackend) == []  # installed: imported by the executors
        payload = cloudpickle.dumps(module.MyJob)
        del sys.modules["my_local_job"]
        assert cloudpickle.loads(payload).__mro__[1].__name__ == "CountUrls"
    finally:
        sys.modules.pop("my_local_job", None)


class _Sibling:
    """Another Python worker of the same executor (a forked process): it runs batches, then serves.

    ``commands`` go to it over a pipe: ``("batch", records)`` runs and completes a
    batch there and sends back the driver's view of it; ``("arm", n)`` makes
    ``FailOnce`` fail at the n-th record, ``("arm-stop", n)`` makes ``StopOnce`` stop
    its process there; ``("quit", None)`` ends it.
    """

    def __init__(self, driver: Driver, *others: Driver) -> None:
        import multiprocessing

        self.driver = driver
        self.others = others  # ("batch-of", (i, records)) runs a batch of others[i] there
        ctx = multiprocessing.get_context("fork")
        self.conn, child = ctx.Pipe()
        self.process = ctx.Process(target=self._serve, args=(child,), daemon=True)
        self.process.start()

    def _serve(self, conn: Any) -> None:
        import logging
        import threading

        driver = self.driver
        logged: list[str] = []  # what statekit.spark logs here, for ("log", None)
        changed = threading.Condition()

        def emit(record: logging.LogRecord) -> None:
            with changed:
                logged.append(record.getMessage())
                changed.notify_all()

        handler = logging.Handler()
        handler.emit = emit  # type: ignore[method-assign]
        logging.getLogger("statekit.spark").addHandler(handler)
        while True:
            command, arg = conn.recv()
            if command == "log":
                conn.send(list(logged))
            elif command == "wait-log":  # (text, bound): block until a message holds text; all of them
                with changed:
                    changed.wait_for(lambda: any(arg[0] in m for m in logged), timeout=arg[1])
                    conn.send(list(logged))
            elif command == "batch":
                report = driver.batch(arg)
                conn.send((report, driver.latest, driver.next_id))
            elif command == "batch-of":
                other = self.others[arg[0]]
                conn.send((other.batch(arg[1]), other.latest, other.next_id))
            elif command == "arm":
                FailOnce.countdown = arg
                conn.send(None)
            elif command == "arm-stop":
                StopOnce.countdown = arg
                conn.send(None)
            else:
                conn.send(None)
                return

    def batch(self, records: list[dict[str, Any]]) -> dict[str, Any]:
        self.conn.send(("batch", records))
        report, self.driver.latest, self.driver.next_id = self.conn.recv()
        return report

    def batch_of(self, i: int, records: list[dict[str, Any]]) -> dict[str, Any]:
        self.conn.send(("batch-of", (i, records)))
        report, self.others[i].latest, self.others[i].next_id = self.conn.recv()
        return report

    def log(self) -> list[str]:
        self.conn.send(("log", None))
        return self.conn.recv()  # type: ignore[no-any-return]

    def wait_for_log(self, text: str, bound: float) -> list[str]:
        """The messages logged here once one holds ``text`` (woken by the log), or after ``bound`` s."""
        self.conn.send(("wait-log", (text, bound)))
        return self.conn.recv()  # type: ignore[no-any-return]

    def call(self, command: str, arg: Any = None) -> None:
        self.conn.send((command, arg))
        self.conn.recv()

    def stop(self) -> None:
        if self.process.is_alive():
            self.call("quit")
        self.process.join(10)


@pytest.mark.parametrize("vectorized", [False, True], ids=["records", "batch-function"])
def test_a_task_hands_its_rows_to_the_sibling_worker_whose_state_is_open(
    tmp_path: Path, vectorized: bool
) -> None:
    import os

    driver = Driver(tmp_path, CountUrlsBatch if vectorized else CountUrls, vectorized=vectorized)
    sibling = _Sibling(driver)
    try:
        first = sibling.batch(RECORDS[:300])
        assert first["pid"] == sibling.process.pid and first["handed_from"] is None
        report = driver.batch(RECORDS[300:])  # Spark gave the next task to this worker
        # It ran where the state is open: reused there, nothing restored here.
        assert report["how"] == "reused" and report["reused"] is True
        assert report["pid"] == sibling.process.pid and report["handed_from"] == os.getpid()
        assert report["phases"]["restore"] < 0.5
        assert driver.batch(RECORDS[:100])["pid"] == sibling.process.pid  # and stays there
    finally:
        sibling.stop()
    assert driver.state() == model_state(RECORDS + RECORDS[:100])


def test_a_sibling_serves_hand_offs_under_every_local_directory_it_held_state_in(tmp_path: Path) -> None:
    """A worker that ran a query with another statekit.local-dir still serves the first query's tasks.

    Its server used to move to the directory of the latest announcement, so the
    owner files of the first query's subtasks named a socket nobody served: their
    tasks restored instead of handing off (shared Spark sessions of tests met it).
    """
    import os

    first = Driver(tmp_path / "first")
    other = Driver(tmp_path / "other", local_dir=str(tmp_path / "other-executor"), job_id="other")
    sibling = _Sibling(first, other)
    try:
        assert sibling.batch(RECORDS[:300])["pid"] == sibling.process.pid
        assert sibling.batch_of(0, RECORDS[:100])["pid"] == sibling.process.pid  # another local dir
        report = first.batch(RECORDS[300:])
        assert report["how"] == "reused" and report["pid"] == sibling.process.pid
        assert report["handed_from"] == os.getpid()
        report = other.batch(RECORDS[100:200])
        assert report["how"] == "reused" and report["handed_from"] == os.getpid()
    finally:
        sibling.stop()
    assert first.state() == model_state(RECORDS)
    assert other.state() == model_state(RECORDS[:200])


def test_an_error_in_the_sibling_fails_the_task_and_the_retry_restores(tmp_path: Path) -> None:
    driver = Driver(tmp_path, function=FailOnce)
    sibling = _Sibling(driver)
    try:
        sibling.batch(RECORDS[:300])
        sibling.call("arm", 3)  # the sibling's function fails at the third record it gets
        plan = driver.plan()
        with pytest.raises(RuntimeError, match="injected") as failed:
            driver.run_task(plan, RECORDS[300:])
        notes = "\n".join(getattr(failed.value, "__notes__", []))
        assert f"Python worker {sibling.process.pid}" in notes and "held subtask 0" in notes
        # The sibling dropped the state its failed run touched: the retry restores, here.
        outputs, report = driver.run_task(plan, RECORDS[300:])
        assert report["how"] != "reused" and report["handed_from"] is None and len(outputs) == 300
        driver.complete(plan, report)
    finally:
        sibling.stop()
    assert driver.state() == model_state(RECORDS)


def test_a_sibling_that_is_gone_leaves_the_task_to_restore_here(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import os
    import signal
    import tempfile

    from statekit.spark import _handoff

    # A hand-off directory of this test's own: any worker that starts serving collects the dead.
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    driver = Driver(tmp_path)
    sibling = _Sibling(driver)
    sibling.batch(RECORDS[:300])
    directory = _handoff._directory()
    assert directory is not None
    dead = [n for n in os.listdir(directory) if n.endswith(f"-{sibling.process.pid}.sock")]
    assert dead
    os.kill(sibling.process.pid, signal.SIGKILL)  # its owner file and socket stay behind
    sibling.process.join(10)
    report = driver.batch(RECORDS[300:])
    assert report["how"] == "local" and report["handed_from"] is None and report["pid"] == os.getpid()
    assert driver.state() == model_state(RECORDS)
    # A worker that starts serving removes what dead workers left: their sockets and owner files.
    _handoff._collect_dead(directory)
    assert not any(os.path.exists(os.path.join(directory, n)) for n in dead)
    for name in os.listdir(directory):
        if name.endswith(".owner"):
            with open(os.path.join(directory, name)) as f:
                assert f.read().split(" ")[0] != str(sibling.process.pid)


def test_a_sibling_holding_another_attempt_is_not_asked(tmp_path: Path) -> None:
    """The owner's state is not the checkpoint's (another attempt completed): restore here."""
    driver = Driver(tmp_path)
    sibling = _Sibling(driver)
    try:
        report = sibling.batch(RECORDS[:300])
        location, token, _ = driver.latest
        driver.latest = (location, token, {0: report["attempt"] + "-other"})
        report = driver.batch(RECORDS[300:])
        assert report["handed_from"] is None and report["how"] == "local"
    finally:
        sibling.stop()
    assert driver.state() == model_state(RECORDS)


def _stalling_requester(driver: Driver, records: list[dict[str, Any]], exit_instead: bool = False) -> None:
    """A task that hands its rows to the sibling, then stops (SIGSTOP), or exits, before it sent them all."""
    import os
    import signal

    plan = driver.plan()
    assert plan.restore_location is not None
    metadata = _Broadcast(driver.storage.read_metadata(plan.restore_location))
    rows = [{**{c: r[c] for c in COLUMNS}, SUBTASK_COLUMN: 0, MARKER_COLUMN: False} for r in records]

    def batches() -> Any:
        import threading

        yield pa.RecordBatch.from_pylist(rows[:100], schema=INPUT)
        if exit_instead:
            os._exit(3)  # a worker that dies mid-input: its connection closes before its rows ended
        # To this thread: a SIGSTOP sent to the process stops the sending thread only when the
        # kernel gets to it, and on a busy machine it first sent the rest and ended the input.
        # The rest never comes, whatever happens to the stop.
        signal.pthread_kill(threading.get_ident(), signal.SIGSTOP)
        threading.Event().wait()
        yield pa.RecordBatch.from_pylist(rows[100:], schema=INPUT)

    list(make_task(plan, metadata)(batches()))


def test_a_requester_that_stops_mid_input_is_dropped_by_the_sibling_within_the_timeout(
    tmp_path: Path,
) -> None:
    """The sibling's reads of a handed-off task's input are bounded: it drops the subtask and says so."""
    import multiprocessing
    import os
    import signal

    driver = Driver(tmp_path, config={"statekit.spark.worker-handoff.timeout": 2})
    sibling = _Sibling(driver)
    requester = multiprocessing.get_context("fork").Process(
        target=_stalling_requester, args=(driver, RECORDS[300:]), daemon=True
    )
    try:
        sibling.batch(RECORDS[:300])
        requester.start()
        # The event itself wakes the wait: the sibling's log. The bound only ends a test that failed;
        # on a busy machine (CI at load 10) the drop comes later than the 2 s, never not at all.
        logged = sibling.wait_for_log("Dropped subtask 0", 600)
        dropped = [m for m in logged if "Dropped subtask 0" in m]
        assert dropped, f"the sibling still waits for the stopped requester's input; it logged {logged}"
        message = dropped[0]
        assert f"Python worker {requester.pid}, which handed its rows here, sent none for 2" in message
        assert "statekit.spark.worker-handoff.timeout" in message
        assert "which the next task restores from the checkpoint" in message
        # The sibling holds it no more: the task run again (Spark's retry) restores it here.
        report = driver.batch(RECORDS[300:])
        assert report["how"] == "local" and report["handed_from"] is None and report["pid"] == os.getpid()
    finally:
        if requester.pid is not None:
            os.kill(requester.pid, signal.SIGKILL)
            requester.join(10)
        sibling.stop()
    assert driver.state() == model_state(RECORDS)


def test_a_requester_that_dies_mid_input_is_dropped_by_the_sibling_saying_so(tmp_path: Path) -> None:
    """Its connection ends before its rows did: the sibling ends the run, drops the subtask, logs why."""
    import multiprocessing
    import os

    driver = Driver(tmp_path, config={"statekit.spark.worker-handoff.timeout": 60})
    sibling = _Sibling(driver)
    requester = multiprocessing.get_context("fork").Process(
        target=_stalling_requester, args=(driver, RECORDS[300:], True), daemon=True
    )
    try:
        sibling.batch(RECORDS[:300])
        requester.start()
        logged = sibling.wait_for_log("Dropped subtask 0", 600)  # long before the 60 s timeout
        dropped = [m for m in logged if "Dropped subtask 0" in m]
        assert dropped, f"the sibling did not drop the subtask; it logged {logged}"
        assert (
            f"Python worker {requester.pid}, which handed its rows here, closed the connection" in dropped[0]
        )
        requester.join(60)
        assert requester.exitcode == 3
        report = driver.batch(RECORDS[300:])  # the retry restores here, exactly
        assert report["how"] == "local" and report["handed_from"] is None and report["pid"] == os.getpid()
    finally:
        sibling.stop()
    assert driver.state() == model_state(RECORDS)


def test_a_sibling_that_stops_after_accepting_fails_the_task_naming_it_and_the_retry_restores(
    tmp_path: Path,
) -> None:
    """The sibling accepts, then its process stops (SIGSTOP): the task fails within the timeout."""
    import os
    import signal
    import time

    from statekit.errors import CheckpointError

    driver = Driver(tmp_path, function=StopOnce, config={"statekit.spark.worker-handoff.timeout": 2})
    sibling = _Sibling(driver)
    pid = sibling.process.pid
    try:
        sibling.batch(RECORDS[:300])
        sibling.call("arm-stop", 3)
        plan = driver.plan()
        started = time.monotonic()
        with pytest.raises(CheckpointError) as failed:
            driver.run_task(plan, RECORDS[300:])
        waited = time.monotonic() - started
        with open(f"/proc/{pid}/stat") as f:
            assert f.read().rsplit(")", 1)[1].split()[0] == "T"  # it accepted, then stopped
        message = str(failed.value)
        assert f"Python worker {pid} (socket " in message and f"-{pid}.sock;" in message, message
        assert "received nothing for 2 s" in message and "statekit.spark.worker-handoff.timeout" in message
        assert "restores the subtask from the checkpoint" in message
        assert waited < 60  # bounded: without the timeout it waits for ever
        # Spark's retry: the stopped sibling cannot answer its handshake, so the task restores here.
        outputs, report = driver.run_task(plan, RECORDS[300:])
        assert report["how"] != "reused" and report["handed_from"] is None and len(outputs) == 300
        assert report["pid"] == os.getpid()
        driver.complete(plan, report)
    finally:
        os.kill(pid, signal.SIGKILL)
        sibling.process.join(10)
    assert driver.state() == model_state(RECORDS)


def _shared_top() -> str:
    """A directory under /tmp the second user can reach (pytest's tmp_path is root's alone)."""
    import os
    import tempfile

    top = tempfile.mkdtemp(prefix="statekit-task-", dir="/tmp")
    os.chmod(top, 0o755)
    return top


def test_a_handoff_directory_the_second_user_prepared_turns_the_handoff_off_and_says_why(
    tmp_path: Path, second_user: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """$TMPDIR/statekit-<uid> made by another user in advance: no owner file or socket goes there."""
    import os
    import shutil
    import tempfile

    top = _shared_top()
    try:
        tmp = os.path.join(top, "tmp")
        os.mkdir(tmp)
        os.chmod(tmp, 0o1777)  # a shared temporary directory, like /tmp
        monkeypatch.setattr(tempfile, "tempdir", tmp)
        prepared = os.path.join(tmp, f"statekit-{os.getuid()}")
        second_user.run("mkdir", "-m", "0777", prepared)
        driver = Driver(tmp_path)
        first = driver.batch(RECORDS[:300])
        assert first["handoff"].startswith(
            f"off: the hand-off directory {prepared} belongs to user id {second_user.uid}"
        ), first["handoff"]
        assert "Until then the hand-off between Python workers is off." in first["handoff"]
        second = driver.batch(RECORDS[300:])
        assert second["handoff"] == first["handoff"] and second["handed_from"] is None
        assert os.listdir(prepared) == []  # root could have written there: statekit did not
        assert driver.state() == model_state(RECORDS)
    finally:
        shutil.rmtree(top)


def test_the_handoff_directory_is_made_private(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import os
    import stat
    import tempfile

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    report = Driver(tmp_path).batch(RECORDS[:100])
    directory = tmp_path / f"statekit-{os.getuid()}"
    assert report["handoff"] == "on"
    assert stat.S_IMODE(directory.lstat().st_mode) == 0o700
    owners = [p for p in directory.iterdir() if p.name.endswith(".owner")]
    assert len(owners) == 1 and stat.S_IMODE(owners[0].lstat().st_mode) == 0o600


def test_an_executor_directory_the_second_user_prepared_is_refused(tmp_path: Path, second_user: Any) -> None:
    """<local dir>/statekit made by another user in advance: the task fails, naming it and the way out."""
    import os
    import shutil

    from statekit.errors import UnsafeLocalPathError

    top = _shared_top()
    try:
        local = os.path.join(top, "local")
        os.mkdir(local)
        os.chmod(local, 0o1777)
        second_user.run("mkdir", "-m", "0755", os.path.join(local, "statekit"))
        driver = Driver(tmp_path, local_dir=local)
        with pytest.raises(UnsafeLocalPathError, match=rf"{local} can be written by its group or by others"):
            driver.run_task(driver.plan(), RECORDS[:100])  # statekit.local-dir itself is checked too
        os.chmod(local, 0o755)  # now only the directory the second user made in advance is wrong
        with pytest.raises(UnsafeLocalPathError) as refused:
            driver.run_task(driver.plan(), RECORDS[:100])
        message = str(refused.value)
        assert message.startswith(
            f"the executor's statekit directory {local}/statekit belongs to user id {second_user.uid}"
        )
        assert message.endswith("Or set statekit.local-dir to a directory of your own.")
        assert os.listdir(os.path.join(local, "statekit")) == []
    finally:
        shutil.rmtree(top)


class _FilesOnly(Driver):
    """Every state in a file of its own (none inline in the metadata): restores read files."""

    def plan(self, *, run_id: str = "run-1") -> TaskPlan:
        import dataclasses

        plan = super().plan(run_id=run_id)
        files = {**plan.config.as_dict(), "statekit.checkpoint.storage.filesystem.inline-threshold": 0}
        return dataclasses.replace(plan, config=Configuration(files))


def test_a_local_recovery_directory_another_user_prepared_turns_local_recovery_off(
    tmp_path: Path, second_user: Any
) -> None:
    """As another local user, plant the operator's copies directory as a symlink to a root-only one.

    Local recovery is off in that worker, with the reason in every task's report
    (``BatchInfo.local_recovery``); statekit writes and deletes nothing there, and
    restores read the checkpoint storage.
    """
    import os
    import shutil
    import tempfile

    from statekit.spark._batchinfo import local_recovery_status

    top = tempfile.mkdtemp(prefix="statekit-lr-", dir="/tmp")
    try:
        os.chmod(top, 0o755)  # the second user must reach it
        shared = os.path.join(top, "shared")
        os.mkdir(shared)
        os.chmod(shared, 0o755)  # the configured local directory: ours, the second user may pass
        secret = os.path.join(top, "secret")
        os.mkdir(secret, 0o700)
        with open(os.path.join(secret, "keep"), "w") as f:
            f.write("x")
        # The executor's statekit directory is ours (a directory another user made there fails every
        # task: test_an_executor_directory_the_second_user_prepared_is_refused); one below it that another
        # user was given, and planted a symlink in, only turns local recovery off.
        os.mkdir(os.path.join(shared, "statekit"), 0o711)
        os.mkdir(os.path.join(shared, "statekit", "local-recovery"), 0o700)
        os.chown(os.path.join(shared, "statekit", "local-recovery"), second_user.uid, second_user.gid)
        op = os.path.join(shared, "statekit", "local-recovery", "unit", "process")
        second_user.run("mkdir", "-p", op)
        second_user.run("ln", "-s", secret, os.path.join(op, "files"))
        driver = _FilesOnly(tmp_path)
        driver.local_dir = shared
        first = driver.batch(RECORDS[:300])
        reset_cache()  # the next task restores, as on another worker
        second = driver.batch(RECORDS[300:])
        for report in (first, second):
            why = report["local_recovery"]
            assert why.startswith(
                f"off: the local-recovery directory {shared}/statekit/local-recovery belongs to user id "
            )
            assert f"user id {second_user.uid}, not to the running user" in why
        assert (
            local_recovery_status([first["local_recovery"], second["local_recovery"]])
            == first["local_recovery"]
        )
        assert second["how"] == "remote" and second["copies_rejected"] == 0
        assert os.listdir(secret) == ["keep"]  # nothing written, nothing deleted
        assert os.readlink(os.path.join(op, "files")) == secret
        assert driver.state() == model_state(RECORDS)
    finally:
        shutil.rmtree(top, ignore_errors=True)


def test_a_worker_unpickling_its_task_imports_none_of_the_drivers_modules() -> None:
    # A Spark worker imports statekit.spark to unpickle its task: the package's public names (the
    # driver's API, its runner, the savepoint writer, the log source) come on first use, not then.
    import subprocess
    import sys

    code = """
import sys
import statekit.spark._task
driver = sorted(m for m in ("statekit.spark._api", "statekit.spark._driver", "statekit.spark._bootstrap",
                            "statekit.spark._log_source", "statekit.spark._state_source") if m in sys.modules)
assert not driver, driver
from statekit.spark import keyed, write_savepoint, BatchInfo
import statekit.spark
assert statekit.spark.keyed is keyed and set(statekit.spark.__all__) <= set(dir(statekit.spark))
"""
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)


def test_a_batch_plan_travels_in_the_local_property_whole(tmp_path: Path) -> None:
    driver = Driver(tmp_path)
    driver.batch(RECORDS[:300])
    plan = dataclasses.replace(driver.plan(), watermark=-(2**63), end_of_input=True, restore_claimed=True,
                               batch_id=7, query_id="q", partition_subtask=True)  # fmt: skip
    query_plan = dataclasses.replace(plan, checkpoint_id=0, token="", restore_location=None,
                                     restore_token=None, restore_attempts={}, watermark=0,
                                     end_of_input=False, restore_claimed=False, batch_id=0,
                                     query_id="")  # fmt: skip
    for metadata in (InlineMetadata(b"\x00\xffmeta"), StoredMetadata("s3://b/ckpt/chk-1", "ab" * 32)):
        again, shipped = batch_plan(query_plan, batch_property(plan, metadata))
        assert again == plan and shipped == metadata
        assert again.restore_attempts == {0: driver.latest[2][0]}  # type: ignore[index]


def test_a_task_whose_job_lacks_the_batch_plan_processes_nothing_and_says_why(tmp_path: Path) -> None:
    driver = Driver(tmp_path)
    plan = dataclasses.replace(driver.plan(), partition_subtask=True)
    other = batch_property(dataclasses.replace(plan, run_id="run-2"), InlineMetadata(b""))
    for text in (None, other):
        with pytest.raises(CheckpointError) as e:
            batch_plan(plan, text)
        assert "local property statekit.batch.plan" in str(e.value)
        assert "pyspark.InheritableThread" in str(e.value)
    with pytest.raises(CheckpointError, match="missing"):
        list(make_task(plan, None)(iter([])))  # outside Spark: no job, no plan
    assert not Path(driver.dir).exists()  # nothing written
