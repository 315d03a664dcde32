"""Raw keyed and raw operator state through the LocalRunner: rescaled 2 → 3 → 1, refused, corrupt."""

from __future__ import annotations

import json
import os
import struct
import zlib
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from statekit import (
    KeyedProcessFunction,
    LocalRunner,
    ProcessContext,
    RawStateRestoreContext,
    RawStateSnapshotContext,
    RecordSource,
    RuntimeContext,
)
from statekit.checkpointing import load_checkpoint
from statekit.cli._cli import main
from statekit.errors import CorruptCheckpointError, StateError, StateMigrationError
from statekit.state_processor import SavepointReader, SavepointWriter

MAXP = 128
RECORDS = [{"url": f"/u{i % 37}"} for i in range(600)]


class RawCounter(KeyedProcessFunction):
    """Counts per key in a dict it serialises itself, per key group; keeps raw operator items too."""

    def __init__(self) -> None:
        self.counts: dict[int, Counter[str]] = {}
        self.items: list[bytes] | None = None
        self.restored_key_groups: list[int] = []

    def restore_raw_state(self, ctx: RawStateRestoreContext) -> None:
        for kg, stream in ctx.raw_keyed_inputs():
            assert kg in ctx.key_groups
            self.counts[kg] = Counter(json.loads(stream.read()))
            self.restored_key_groups.append(kg)
        self.items = list(ctx.raw_operator_items)

    def open(self, ctx: RuntimeContext) -> None:
        self.runtime = ctx
        if self.items is None:  # a fresh subtask: one item naming it
            self.items = [f"origin-{ctx.subtask_index}".encode()]

    def process(self, record: Any, ctx: ProcessContext) -> Iterator[Any]:
        key = ctx.current_key
        counts = self.counts.setdefault(self.runtime.key_group_of(key), Counter())
        counts[key] += 1
        yield key, counts[key]

    def snapshot_raw_state(self, ctx: RawStateSnapshotContext) -> None:
        for kg, counts in self.counts.items():
            ctx.raw_keyed_output(kg).write(json.dumps(dict(counts)).encode())
        for item in self.items or []:
            ctx.add_raw_operator_item(item)


class NoRawRestore(KeyedProcessFunction):
    def process(self, record: Any, ctx: ProcessContext) -> None:
        return None


def _runner(
    tmp_path: Path,
    p: int,
    function: type[KeyedProcessFunction] = RawCounter,
    *,
    inline: int = 20480,
    config_extra: dict[str, Any] | None = None,
    **kw: Any,
) -> LocalRunner:
    config = {
        **(config_extra or {}),
        "statekit.checkpoint.storage.filesystem.inline-threshold": inline,
        "statekit.checkpoints.dir": str(tmp_path / "ckpt"),
        "statekit.savepoints.dir": str(tmp_path / "sp"),
        "statekit.parallelism": p,
        "statekit.max-parallelism": MAXP,
    }
    return LocalRunner(function, key_selector=lambda r: r["url"], config=config, **kw)


def _functions(r: LocalRunner) -> list[RawCounter]:
    return [st.function for st in r._operator.subtasks]  # type: ignore[misc]


def test_raw_state_rescales_2_3_1_by_key_group_and_even_split(tmp_path: Path) -> None:
    last: dict[str, int] = {}
    src = RecordSource(RECORDS)
    r1 = _runner(tmp_path, 2, sink=lambda out: last.__setitem__(*out))
    r1.run(src, max_records=200)
    r1.checkpoint()
    r1.close()

    r2 = _runner(tmp_path, 3, sink=lambda out: last.__setitem__(*out))
    r2.run(src, restore="latest", max_records=200)
    fns = _functions(r2)
    # Every subtask got exactly the key groups it owns, and the two items split evenly: 1, 1, 0.
    for i, fn in enumerate(fns):
        owned = r2.subtasks[i].keyed_backend.key_group_range
        assert fn.restored_key_groups and all(kg in owned for kg in fn.restored_key_groups)
    assert [fn.items for fn in fns] == [[b"origin-0"], [b"origin-1"], []]
    savepoint = r2.savepoint()  # at parallelism 3, after 400 records
    r2.close()

    r3 = _runner(tmp_path, 1, sink=lambda out: last.__setitem__(*out))
    assert r3.run(src, restore=savepoint).records == len(RECORDS) - 400
    (fn,) = _functions(r3)
    assert fn.items == [b"origin-0", b"origin-1"]
    r3.close()
    # The counts the function kept only as raw state went on exactly across both rescales.
    assert last == dict(Counter(r["url"] for r in RECORDS))


def test_state_processor_reads_raw_state_as_bytes(tmp_path: Path) -> None:
    r1 = _runner(tmp_path, 2)
    r1.run(RecordSource(RECORDS))
    loc = r1.savepoint()
    r1.close()
    raw = SavepointReader.open(loc).raw_state("process")
    assert raw.items == [b"origin-0", b"origin-1"]
    counts: Counter[str] = Counter()
    for kg, data in raw.keyed.items():
        assert 0 <= kg < MAXP
        counts.update(json.loads(data))
    assert counts == Counter(r["url"] for r in RECORDS)


def test_raw_state_into_a_function_without_restore_hook_is_refused_unless_allowed(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    r1 = _runner(tmp_path, 2)
    r1.run(RecordSource(RECORDS), max_records=50)
    r1.checkpoint()
    r1.close()
    with pytest.raises(StateMigrationError, match="declares no restore_raw_state.*allow_non_restored_state"):
        _runner(tmp_path, 2, NoRawRestore).restore("latest")
    allowed = _runner(tmp_path, 2, NoRawRestore, allow_non_restored_state=True)
    with caplog.at_level("WARNING", logger="statekit.state"):
        allowed.restore("latest")
    assert "raw state of operator 'process'" in caplog.text and "dropped" in caplog.text
    allowed.close()


def _raw_files(location: str) -> list[str]:
    return sorted(os.path.join(location, n) for n in os.listdir(location) if ".raw" in n)


def test_damaged_raw_state_is_refused_naming_the_file_and_nothing_restored(tmp_path: Path) -> None:
    r1 = _runner(tmp_path, 2, inline=0)  # every raw state a file of its own
    r1.run(RecordSource(RECORDS), max_records=300)
    loc = r1.checkpoint()
    r1.close()
    files = _raw_files(loc)
    assert len(files) == 2
    data = bytearray(Path(files[0]).read_bytes())
    data[-1] ^= 0xFF
    Path(files[0]).write_bytes(bytes(data))
    r2 = _runner(tmp_path, 3, inline=0)
    with pytest.raises(CorruptCheckpointError, match=os.path.basename(files[0])):
        r2.restore(loc)
    assert r2._operator.subtasks == []  # nothing was restored, nothing half-given to a function
    os.remove(files[0])
    with pytest.raises(CorruptCheckpointError, match=os.path.basename(files[0])):
        _runner(tmp_path, 1, inline=0).restore(loc)
    assert load_checkpoint(r1.storage, loc).has_raw_state("process")


def _raw_checkpoint(tmp_path: Path, backend: str = "heap") -> tuple[str, Counter[str]]:
    """A checkpoint of RawCounter at parallelism 2, every file its own, and the counts it holds."""
    r = _runner(tmp_path, 2, inline=0, config_extra={"statekit.backend": backend})
    r.run(RecordSource(RECORDS), max_records=300)
    loc = r.checkpoint()
    r.close()
    return loc, Counter(rec["url"] for rec in RECORDS[:300])


def _restored_counts(tmp_path: Path, location: str, p: int) -> tuple[Counter[str], list[bytes]]:
    r = _runner(tmp_path / "again", p)
    r.restore(location)
    r.run(RecordSource([]))
    counts: Counter[str] = Counter()
    items: list[bytes] = []
    for fn in _functions(r):
        for c in fn.counts.values():
            counts.update(c)
        items += fn.items or []
    r.close()
    return counts, items


def test_inspect_shows_raw_sizes_and_verify_reads_raw_files(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    loc, _ = _raw_checkpoint(tmp_path)
    assert main(["checkpoints", "inspect", loc, "--json"]) == 0
    shown = json.loads(capsys.readouterr().out)
    sizes = {f: sum(s[f] for s in shown["subtasks"]) for f in ("raw_keyed_bytes", "raw_operator_items")}
    assert sizes["raw_operator_items"] == 2 and sizes["raw_keyed_bytes"] > 0
    assert shown["operators"]["process"]["raw_operator_items"] == 2
    assert main(["checkpoints", "inspect", loc]) == 0
    assert "raw keyed bytes" in capsys.readouterr().out
    assert main(["checkpoints", "verify", loc]) == 0
    capsys.readouterr()
    raw = _raw_files(loc)[1]
    data = bytearray(Path(raw).read_bytes())
    data[len(data) // 2] ^= 0x01
    Path(raw).write_bytes(bytes(data))
    assert main(["checkpoints", "verify", loc]) == 1
    assert os.path.basename(raw) in capsys.readouterr().out


@pytest.mark.parametrize("backend", ["heap", "rocksdb"])
def test_savepoint_convert_carries_raw_state(
    tmp_path: Path, backend: str, capsys: pytest.CaptureFixture[str]
) -> None:
    loc, counts = _raw_checkpoint(tmp_path, backend)
    assert main(["savepoint", "convert", loc, "--target", str(tmp_path / "sp"), "--no-progress"]) == 0
    savepoint = capsys.readouterr().out.strip().rsplit(" ", 1)[-1]
    got, items = _restored_counts(tmp_path, savepoint, 3)
    assert got == counts and sorted(items) == [b"origin-0", b"origin-1"]


def test_state_processor_rewrite_carries_raw_state_and_refuses_a_new_max_parallelism(tmp_path: Path) -> None:
    loc, counts = _raw_checkpoint(tmp_path)
    rewritten = SavepointWriter.from_existing(loc).write(str(tmp_path / "rewritten"), parallelism=3)
    got, items = _restored_counts(tmp_path, rewritten, 1)
    assert got == counts and items == [b"origin-0", b"origin-1"]
    writer = SavepointWriter.from_existing(loc).with_max_parallelism(256)
    with pytest.raises(StateError, match="raw state, kept per key group of max parallelism 128"):
        writer.write(str(tmp_path / "wider"))
    assert SavepointWriter.from_existing(loc).remove_operator("process").write(str(tmp_path / "without"))


def test_a_crafted_raw_entry_is_refused_naming_the_metadata_and_subtask(tmp_path: Path) -> None:
    r1 = _runner(tmp_path, 2)
    r1.run(RecordSource(RECORDS), max_records=100)
    loc = r1.checkpoint()
    r1.close()
    path = Path(loc) / "_metadata"
    data = path.read_bytes()
    meta = json.loads(data[8:-4])
    raw = meta["operators"]["process"][0]["raw"]
    # Subtask 0 claims a block of a key group subtask 1 owns: it would be handed to two subtasks.
    raw["key_groups"]["127"] = next(iter(raw["key_groups"].values()))
    raw["block_sha256"]["127"] = next(iter(raw["block_sha256"].values()))
    body = json.dumps(meta).encode()
    path.write_bytes(data[:8] + body + struct.pack("<I", zlib.crc32(body)))
    r2 = _runner(tmp_path, 3)
    with pytest.raises(
        CorruptCheckpointError, match=r"_metadata: operator 'process' subtask 0: malformed raw"
    ):
        r2.restore(loc)
    assert r2._operator.subtasks == []
