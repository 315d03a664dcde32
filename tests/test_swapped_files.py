"""A checkpoint file replaced by another checkpoint's valid file is found by its digest: restore, verify.

The reproduction of issue #32, on real files: a job whose state keeps its size
(one count per URL) writes checkpoints 1 to 3; then chk-2's file is copied
over chk-3's, the same size, with every CRC-32 of its own valid. Before
digests, ``restore="latest"`` took chk-3 and the counts ended short without a
word, and ``checkpoints verify`` said both were fine. Now chk-3 is skipped
naming the file, chk-2 is restored and the source replayed from it: every
count exact; ``verify`` exits 1 naming the file.
"""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

import pytest

from statekit import KeyedProcessFunction, LocalRunner, RecordSource, ValueStateDescriptor
from statekit.backend_api import key_group_for_bytes
from statekit.checkpointing import load_checkpoint
from statekit.cli._cli import main
from statekit.serializers import StrSerializer

COUNT = ValueStateDescriptor("count", int, default=0)
URLS = [f"/api/{i}" for i in range(8)]
RECORDS = [{"url": URLS[i % len(URLS)]} for i in range(12 * len(URLS))]  # 12 of each, in turn
NOT_RECORDED = "the bytes are not the ones this checkpoint recorded"


class Count(KeyedProcessFunction):
    """One count per URL: the state's files keep their size from one checkpoint to the next."""

    def open(self, ctx: Any) -> None:
        self.count = ctx.get_state(COUNT)

    def process(self, record: dict[str, Any], ctx: Any) -> Any:
        n = self.count.value() + 1
        self.count.update(n)
        yield (ctx.current_key, n)


def runner(root: Path, backend: str) -> LocalRunner:
    name, _, fmt = backend.partition("/")
    config = {
        "statekit.checkpoints.dir": str(root),
        "statekit.backend": name,
        # heap's own checkpoints are deltas ("heap/delta"); "heap" here tests its canonical files
        "statekit.checkpoint.format": "native" if fmt == "delta" or name != "heap" else "canonical",
        "statekit.parallelism": 2,
        "statekit.checkpoint.storage.filesystem.inline-threshold": 0,  # every state in a file
        "statekit.checkpoint.interval-records": 2 * len(URLS),
        "statekit.checkpoints.retained": 10,
    }
    if fmt == "delta":  # every key changes between checkpoints: deltas still, not a base each time
        config["statekit.backend.heap.max-delta-ratio"] = 100.0
    return LocalRunner(Count, key_selector=lambda r: r["url"], config=config)


def counts(r: LocalRunner) -> dict[str, int]:
    out = {}
    for ctx in r.subtasks:
        backend = ctx.keyed_backend
        state = backend.get_state(COUNT)
        for url in URLS:
            kg = key_group_for_bytes(StrSerializer().serialize(url), r.max_parallelism)
            if kg in backend.key_group_range:
                backend.set_current_key(url)
                out[url] = state.value()
    return out


def three_checkpoints(root: Path, backend: str) -> list[str]:
    """chk-1, chk-2, chk-3 after 2, 4 and 6 records of each URL."""
    with runner(root, backend) as r:
        result = r.run(RecordSource(RECORDS), max_records=6 * len(URLS))
    assert [loc.rsplit("/", 1)[1] for loc in result.checkpoints] == ["chk-1", "chk-2", "chk-3"]
    return result.checkpoints


def swap(root: Path, backend: str, locations: list[str]) -> Path:
    """Copy a file of chk-2 over the same-sized file chk-3 names in its place; returns the victim."""
    with runner(root, backend) as r:
        two, three = (load_checkpoint(r.storage, loc).metadata for loc in locations[1:])
    keyed2, keyed3 = two.operators["process"][0].keyed, three.operators["process"][0].keyed
    assert keyed2 is not None and keyed3 is not None
    if backend == "heap":
        source, victim = Path(locations[1], "process-0.keyed"), Path(locations[2], "process-0.keyed")
    else:
        # An SST file (a delta of heap's) chk-3 uploaded, and one of the same size chk-2 uploaded.
        suffix = ".sst" if backend == "rocksdb" else ""

        def sst(keyed: dict[str, Any], n: int) -> dict[str, Any]:
            (f,) = [
                f for f in keyed["native"]["files"] if f["name"].endswith(suffix) and f["checkpoint_id"] == n
            ]
            return f

        mine, theirs = sst(keyed3, 3), sst(keyed2, 2)
        source = Path(locations[1], theirs["handle"]["path"]).resolve()
        victim = Path(locations[2], mine["handle"]["path"]).resolve()
    original, replacement = victim.read_bytes(), source.read_bytes()
    # The same size, and valid by every CRC of its own: only a digest tells it from chk-3's file.
    assert len(replacement) == len(original) and replacement != original
    victim.write_bytes(replacement)
    return victim


@pytest.mark.parametrize("backend", ["heap", "rocksdb", "heap/delta"], ids=["canonical", "native", "delta"])
def test_a_file_swapped_from_an_older_checkpoint_is_skipped_and_the_counts_end_exact(
    tmp_path: Path, backend: str, capsys: pytest.CaptureFixture[str]
) -> None:
    root = tmp_path / "ckpt"
    locations = three_checkpoints(root, backend)
    victim = swap(root, backend, locations)

    # verify reads every byte: chk-3 is not the checkpoint it recorded, chk-1 and chk-2 are.
    code = main(["checkpoints", "verify", str(root), "--job", "job"])
    out = capsys.readouterr().out
    assert code == 1
    rows = [line.split("\t") for line in out.splitlines()[1:]]
    assert [(r[0].rsplit("/", 1)[1], r[1]) for r in rows] == [
        ("chk-1", "verified"),
        ("chk-2", "verified"),
        ("chk-3", "unreadable"),
    ]
    assert rows[2][2].removeprefix("file://") == str(victim) and NOT_RECORDED in rows[2][3]

    with runner(root, backend) as r, warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        result = r.run(RecordSource(RECORDS), restore="latest")
        assert result.restored_from == locations[1]
        ((skipped, reason),) = result.skipped_checkpoints
        assert skipped == locations[2] and str(victim) in reason and NOT_RECORDED in reason, reason
        assert any("restore skipped" in str(w.message) and str(victim) in str(w.message) for w in caught)
        assert result.records == len(RECORDS) - 4 * len(URLS)  # replayed from chk-2's position
        assert counts(r) == dict.fromkeys(URLS, 12)
        # Both subtasks hold counts, so the swapped file of subtask 0 held some of them.
        assert all(counts_of(r, i) for i in range(2))


def counts_of(r: LocalRunner, subtask: int) -> int:
    return r.subtasks[subtask].keyed_backend.num_entries()
