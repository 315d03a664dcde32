"""Jobs and data shared by the integration tests."""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Iterable, Mapping
from typing import Any

from statekit import (
    CheckpointInfo,
    ColumnsContext,
    KeyedBatchFunction,
    KeyedColumnsFunction,
    KeyedProcessFunction,
    ListStateDescriptor,
    LocalRunner,
    MapStateDescriptor,
    ProcessContext,
    RecordSource,
    ReducingStateDescriptor,
    RuntimeContext,
    ValueStateDescriptor,
)

COUNT = ValueStateDescriptor("count", int, default=0)
LAST = ListStateDescriptor("last_methods", str)
BYTES = ReducingStateDescriptor("bytes", lambda a, b: a + b, int)
SEEN = ListStateDescriptor("seen_by_subtask", int)
RULES = MapStateDescriptor("rules", str, str)


class CountUrls(KeyedProcessFunction):
    """Counts requests per URL; also keeps a list, a reducing state and operator state."""

    def open(self, ctx: RuntimeContext) -> None:
        self.count = ctx.get_state(COUNT)
        self.methods = ctx.get_state(LAST)
        self.bytes = ctx.get_state(BYTES)
        self.seen = ctx.get_list_state(SEEN)
        self.rules = ctx.get_broadcast_state(RULES)
        if self.rules.is_empty():
            self.rules.put("version", "1")
        self.index = ctx.subtask_index

    def process(self, record: dict[str, Any], ctx: ProcessContext) -> Iterable[Any]:
        n = self.count.value() + 1
        self.count.update(n)
        self.methods.add(record["request"])
        self.bytes.add(record["bytes"])
        if n == 1:
            self.seen.add(self.index)
        yield (ctx.current_key, n)


class CountUrlsBatch(KeyedBatchFunction):
    """:class:`CountUrls` written with the vectorized API: the same state and outputs, one call per key."""

    def open(self, ctx: RuntimeContext) -> None:
        CountUrls.open(self, ctx)  # type: ignore[arg-type]

    def process_batch(self, rows: Any, ctx: ProcessContext) -> Any:
        n, m = self.count.value(), rows.num_rows
        self.count.update(n + m)
        self.methods.add_all(rows.column("request").to_pylist())
        self.bytes.add(sum(rows.column("bytes").to_pylist()))
        if n == 0:
            self.seen.add(self.index)
        return {"url": [ctx.current_key] * m, "n": range(n + 1, n + m + 1)}


class CountUrlsColumns(KeyedColumnsFunction):
    """:class:`CountUrls` with one call for many rows: the count in bulk, the rest per row."""

    def open(self, ctx: RuntimeContext) -> None:
        CountUrls.open(self, ctx)  # type: ignore[arg-type]

    def process_columns(self, rows: Any, keys: list[Any], ctx: ColumnsContext) -> Any:
        counts = self.count.update_batch(keys, _plus_one)
        for key, n, method, size in zip(
            keys, counts, rows.column("request").to_pylist(), rows.column("bytes").to_pylist()
        ):
            ctx.set_current_key(key)
            self.methods.add(method)
            self.bytes.add(size)
            if n == 1:
                self.seen.add(self.index)
        return {"url": keys, "n": counts}


def _plus_one(n: int) -> int:
    return n + 1


def count_urls_runner(checkpoints_dir: str, conf: Mapping[str, Any] | None = None) -> LocalRunner:
    """A LocalRunner of :class:`CountUrls` at parallelism 2, checkpointing into ``checkpoints_dir``.

    Every state goes into a file of its own (no inline state), so tests can damage or
    lose files; ``conf`` adds or overrides keys. The heap backend writes canonical files
    (``chk-<n>/process-<i>.keyed``) unless ``conf`` names a format: its own checkpoints are
    deltas in the shared area, which tests that damage them ask for.
    """
    config = {
        "statekit.checkpoints.dir": checkpoints_dir,
        "statekit.parallelism": 2,
        "statekit.checkpoint.storage.filesystem.inline-threshold": 0,
        **(conf or {}),
    }
    if config.get("statekit.backend", "heap") == "heap":
        config.setdefault("statekit.checkpoint.format", "canonical")
    return LocalRunner(CountUrls, key_selector=lambda r: r["url"], config=config)


def default_checkpoints(checkpoints_dir: str, backend: str = "heap") -> list[CheckpointInfo]:
    """Two checkpoints of :class:`CountUrls` on ``backend`` with its defaults, as the metrics report them.

    Nothing but the directory, the parallelism (2) and the retention (both kept) is set: the heap
    backend writes its own checkpoints, a base and deltas. chk-1 holds 600 records, chk-2 a few
    more of one URL, so that the heap's chk-2 is a delta on chk-1's base.
    """
    config: dict[str, Any] = {
        "statekit.checkpoints.dir": checkpoints_dir,
        "statekit.parallelism": 2,
        "statekit.checkpoints.retained": 2,
        "statekit.backend": backend,
    }
    runner = LocalRunner(CountUrls, key_selector=lambda r: r["url"], config=config)
    infos: list[CheckpointInfo] = []
    runner.on_checkpoint = infos.append
    records = make_records(600, urls=30, seed=11)
    src = RecordSource(records + [{**records[0], "bytes": i} for i in range(1, 6)])
    runner.run(src, max_records=len(records))
    runner.checkpoint()
    runner.run(src)  # its end of input takes chk-2
    runner.close()
    return infos


def make_records(n: int, *, urls: int = 50, seed: int = 7) -> list[dict[str, Any]]:
    """Deterministic access-log records with Zipf-like URLs."""
    rng = random.Random(seed)
    names = [f"/api/{i}" for i in range(urls)]
    weights = [1.0 / (i + 1) for i in range(urls)]
    out = []
    for i in range(n):
        out.append(
            {
                "@timestamp": f"18/Apr/2019:00:{i // 60 % 60:02d}:{i % 60:02d}",
                "remote_addr": "127.0.0.1",
                "request": rng.choice(["GET", "POST"]),
                "url": rng.choices(names, weights)[0],
                "bytes": rng.randint(1, 1000),
            }
        )
    return out


def expected_counts(records: Iterable[dict[str, Any]]) -> Counter[str]:
    return Counter(r["url"] for r in records)


def state_of_runner(runner: Any) -> dict[str, tuple[int, int, int]]:
    """Per key: (count, len(methods), bytes), read from whichever subtask owns it.

    Asserts every key lives on exactly one subtask, the one owning its key group.
    """
    from statekit.backend_api import key_group_for_bytes

    out: dict[str, tuple[int, int, int]] = {}
    for ctx in runner.subtasks:
        kb = ctx.keyed_backend
        count = kb.get_state(COUNT)
        methods = kb.get_state(LAST)
        total = kb.get_state(BYTES)
        for key in list(kb.keys("count")):
            kg = key_group_for_bytes(kb.key_serializer.serialize(key), ctx.max_parallelism)
            assert kg in kb.key_group_range, (key, kg, kb.key_group_range)
            assert key not in out, f"{key} is on two subtasks"
            kb.set_current_key(key)
            out[key] = (count.value(), len(methods.get()), total.get())
    return out


def model_state(records: Iterable[dict[str, Any]]) -> dict[str, tuple[int, int, int]]:
    out: dict[str, tuple[int, int, int]] = {}
    for r in records:
        c, m, b = out.get(r["url"], (0, 0, 0))
        out[r["url"]] = (c + 1, m + 1, b + r["bytes"])
    return out
