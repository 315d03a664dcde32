"""``statekit checkpoints list|inspect`` and ``statekit savepoint convert``."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from jobs import CountUrls, make_records, model_state, state_of_runner
from statekit import LocalRunner, RecordSource
from statekit._cli import main

RECORDS = make_records(1500, urls=30, seed=9)


def runner(ckpt: Path, p: int, backend: str = "heap") -> LocalRunner:
    return LocalRunner(
        CountUrls,
        key_selector=lambda r: r["url"],
        config={
            "statekit.checkpoints.dir": str(ckpt),
            "statekit.parallelism": p,
            "statekit.checkpoints.retained": 3,
            "statekit.checkpoint.storage.filesystem.inline-threshold": 0,
            "statekit.backend": backend,
        },
    )


@pytest.fixture
def ckpt(tmp_path: Path) -> Path:
    r = runner(tmp_path / "ckpt", 3)
    src = RecordSource(RECORDS)
    r.run(src, max_records=700)
    r.checkpoint()
    r.run(src)
    r.checkpoint()
    return tmp_path / "ckpt"


def test_list_json(ckpt: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["checkpoints", "list", str(ckpt), "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert [r["checkpoint_id"] for r in rows] == [1, 2]
    assert rows[1]["operators"]["process"]["parallelism"] == 3
    # Entries count (key, namespace) pairs of every keyed state: count, last_methods, bytes.
    assert rows[1]["operators"]["process"]["entries"] == 3 * len(model_state(RECORDS))
    assert rows[1]["backend"] == "heap"


def test_list_table_and_module_entry_point(ckpt: Path) -> None:
    out = subprocess.run(
        [sys.executable, "-m", "statekit", "checkpoints", "list", str(ckpt)],
        capture_output=True,
        text=True,
        check=True,
        env={"COLUMNS": "200", "PATH": ""},
    ).stdout
    assert "chk-2" in out and "process (3)" in out


def test_inspect_json(ckpt: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["checkpoints", "inspect", str(ckpt / "job" / "chk-2"), "--json"]) == 0
    info = json.loads(capsys.readouterr().out)
    subtasks = [s for s in info["subtasks"] if s["operator"] == "process"]
    assert [s["key_groups"] for s in subtasks] == [[0, 42], [43, 85], [86, 127]]
    assert sum(s["entries"] for s in subtasks) == 3 * len(model_state(RECORDS))
    assert {s["format"] for s in subtasks} == {"statekit-canonical"}
    assert info["states"]["process/count"]["kind"] == "value"
    assert info["states"]["process/last_methods"]["serializer"] == {
        "id": "list",
        "v": 1,
        "args": [{"id": "str", "v": 1}],
    }


def test_inspect_table(ckpt: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["checkpoints", "inspect", str(ckpt / "job" / "chk-1")]) == 0
    out = capsys.readouterr().out
    assert "checkpoint 1 of job job" in out and "list<str>" in out


def test_convert_makes_a_relocatable_savepoint_restorable_at_another_parallelism(
    ckpt: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["savepoint", "convert", str(ckpt / "job" / "chk-2"), "--target", str(tmp_path / "sp")]) == 0
    location = capsys.readouterr().out.strip().rsplit(" ", 1)[-1]
    moved = tmp_path / "moved"
    Path(location).rename(moved)
    r = runner(tmp_path / "other", 2)
    r.restore(str(moved))
    assert state_of_runner(r) == model_state(RECORDS)


def test_convert_writes_a_native_rocksdb_checkpoint_as_a_canonical_savepoint(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    pytest.importorskip("statekit_rocksdb")
    r = runner(tmp_path / "ckpt", 2, backend="rocksdb")
    r.run(RecordSource(RECORDS))
    chk = r.checkpoint()
    r.close()
    assert json.loads((Path(chk) / "_metadata").read_bytes()[8:-4])["operators"]["process"][0]["keyed"][
        "format"
    ] == "statekit-rocksdb-1"
    assert main(["savepoint", "convert", chk, "--target", str(tmp_path / "sp"), "--no-progress"]) == 0
    location = capsys.readouterr().out.strip().rsplit(" ", 1)[-1]
    heap = runner(tmp_path / "other", 3)  # a canonical savepoint: any backend, any parallelism
    heap.restore(location)
    assert state_of_runner(heap) == model_state(RECORDS)


def test_convert_refuses_a_corrupt_checkpoint_and_leaves_nothing(ckpt: Path, tmp_path: Path) -> None:
    victim = ckpt / "job" / "chk-2" / "process-1.keyed"
    data = bytearray(victim.read_bytes())
    data[len(data) // 2] ^= 1
    victim.write_bytes(bytes(data))
    code = main(
        [
            "savepoint",
            "convert",
            str(ckpt / "job" / "chk-2"),
            "--target",
            str(tmp_path / "sp"),
            "--no-progress",
        ]
    )
    assert code == 2
    assert not any((tmp_path / "sp").glob("savepoint-*/_metadata"))


def test_inspect_missing_location_is_a_clear_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["checkpoints", "inspect", str(tmp_path / "nope")]) == 2
    assert "no completed checkpoint or savepoint" in capsys.readouterr().err
