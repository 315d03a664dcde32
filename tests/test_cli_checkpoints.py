"""``statekit checkpoints list|inspect|verify`` and ``statekit savepoint convert``, damaged input too."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from jobs import CountUrls, default_checkpoints, make_records, model_state, state_of_runner
from statekit import LocalRunner, RecordSource
from statekit.cli._cli import main

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
            # heap's checkpoints are deltas otherwise; these tests read its canonical files
            "statekit.checkpoint.format": "canonical" if backend == "heap" else "native",
        },
    )


@pytest.fixture
def ckpt(tmp_path: Path) -> Path:
    r = runner(tmp_path / "ckpt", 3)
    src = RecordSource(RECORDS)
    r.run(src, max_records=700)
    r.checkpoint()
    r.run(src)  # its end of input takes the final checkpoint, chk-2
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
    assert (
        json.loads((Path(chk) / "_metadata").read_bytes()[8:-4])["operators"]["process"][0]["keyed"]["format"]
        == "statekit-rocksdb-1"
    )
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


# --- damaged checkpoints: list marks them, verify finds them -------------------------------


@pytest.fixture
def three(tmp_path: Path) -> Path:
    """Job ``job``'s chk-1, chk-2 and chk-3 (every state in files of its own) under ``ckpt``."""
    r = runner(tmp_path / "ckpt", 2)
    src = RecordSource(RECORDS)
    for _ in range(3):
        r.run(src, max_records=500)
        r.checkpoint()
    r.close()
    assert sorted(p.name for p in (tmp_path / "ckpt" / "job").glob("chk-*")) == ["chk-1", "chk-2", "chk-3"]
    return tmp_path / "ckpt"


def flip(path: Path, offset: int, count: int = 1) -> None:
    data = bytearray(path.read_bytes())
    for i in range(offset, offset + count):
        data[i] ^= 0xFF
    path.write_bytes(bytes(data))


def flip_a_block(chk: Path) -> tuple[Path, int]:
    """Flips one byte in the middle of a key-group block of subtask 1's keyed file; its file and key group."""
    meta = json.loads((chk / "_metadata").read_bytes()[8:-4])
    keyed = meta["operators"]["process"][1]["keyed"]
    kg, (offset, length) = sorted(keyed["offsets"].items(), key=lambda kv: int(kv[0]))[1]
    victim = chk / keyed["handle"]["path"]
    flip(victim, offset + length // 2)
    return victim, int(kg)


def run_cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def tsv(out: str) -> list[dict[str, str]]:
    header, *rows = out.splitlines()
    return [dict(zip(header.split("\t"), row.split("\t"), strict=True)) for row in rows]


def test_list_shows_every_checkpoint_when_the_newest_metadata_is_corrupt(
    three: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    flip(three / "job" / "chk-3" / "_metadata", 100, 4)
    code, out, err = run_cli(capsys, "checkpoints", "list", str(three))
    assert code == 0
    rows = tsv(out)
    assert [(r["job"], r["id"], r["status"]) for r in rows[:2]] == [
        ("job", "1", "complete"),
        ("job", "2", "complete"),
    ]
    assert rows[2]["id"] == "3" and rows[2]["location"] == str(three / "job" / "chk-3")
    assert rows[2]["status"].startswith("unreadable: _metadata: ") and "checksum" in rows[2]["status"]
    assert rows[2]["operators (parallelism)"] == "-"
    assert "1 of 3 checkpoints cannot be restored" in err

    code, out, _ = run_cli(capsys, "checkpoints", "list", str(three), "--json")
    listed = json.loads(out)
    assert code == 0 and [r["checkpoint_id"] for r in listed] == [1, 2, 3]
    assert [r["status"] for r in listed] == ["complete", "complete", "unreadable"]
    (problem,) = listed[2]["problems"]
    assert problem["file"] == f"{three}/job/chk-3/_metadata" and "checksum" in problem["problem"]
    assert listed[2]["kind"] is None and listed[1]["operators"]["process"]["parallelism"] == 2


def test_list_and_inspect_name_a_missing_file_with_its_full_path(
    three: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    chk = three / "job" / "chk-2"
    (chk / "process-0.operator").unlink()
    code, out, _ = run_cli(capsys, "checkpoints", "list", str(three), "--job", "job")
    assert code == 0
    statuses = [r["status"] for r in tsv(out)]
    assert statuses == ["complete", "unreadable: process-0.operator: the file is missing", "complete"]

    code, out, _ = run_cli(capsys, "checkpoints", "inspect", str(chk), "--json")
    info = json.loads(out)
    assert code == 0 and info["status"] == "unreadable"
    assert [p["file"].removeprefix("file://") for p in info["problems"]] == [str(chk / "process-0.operator")]
    code, out, _ = run_cli(capsys, "checkpoints", "inspect", str(chk))
    assert "status            unreadable" in out and f"{chk}/process-0.operator: the file is missing" in out


def test_verify_reads_every_block_and_reports_each_damaged_file_in_full(
    three: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, err = run_cli(capsys, "checkpoints", "verify", str(three))
    assert code == 0 and [r["status"] for r in tsv(out)] == ["verified"] * 3
    assert err == "3 checkpoints: 3 verified, 0 unreadable\n"

    victim, kg = flip_a_block(three / "job" / "chk-3")
    (three / "job" / "chk-1" / "process-1.keyed").unlink()
    # The quick check of list sees the missing file; only verify reads the flipped block.
    code, out, _ = run_cli(capsys, "checkpoints", "list", str(three))
    assert [r["status"].split(":")[0] for r in tsv(out)] == ["unreadable", "complete", "complete"]

    code, out, err = run_cli(capsys, "checkpoints", "verify", str(three))
    assert code == 1
    rows = {r["checkpoint"]: r for r in tsv(out)}
    assert set(rows) == {str(three / "job" / f"chk-{i}") for i in (1, 2, 3)}
    assert rows[str(three / "job" / "chk-2")]["status"] == "verified"
    bad = rows[str(three / "job" / "chk-3")]
    assert (bad["status"], bad["file"].removeprefix("file://")) == ("unreadable", str(victim))
    assert bad["problem"].startswith(f"the block of key group {kg}: the bytes are not the ones this")
    missing = rows[str(three / "job" / "chk-1")]
    assert missing["file"].endswith("/job/chk-1/process-1.keyed") and "missing" in missing["problem"]
    assert err == "3 checkpoints: 1 verified, 2 unreadable (2 damaged files)\n"

    # One checkpoint, given as its directory (relative, or its _metadata file): the same answer.
    code, out, _ = run_cli(capsys, "checkpoints", "verify", str(victim.parent / "_metadata"), "--json")
    assert code == 1
    (result,) = json.loads(out)
    assert result["location"] == str(victim.parent) and result["status"] == "unreadable"
    assert [p["file"].removeprefix("file://") for p in result["problems"]] == [str(victim)]
    assert run_cli(capsys, "checkpoints", "verify", str(three / "job" / "chk-2"))[0] == 0


def test_verify_names_a_corrupt_metadata_and_checks_a_savepoint(
    three: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["savepoint", "convert", str(three / "job" / "chk-3"), "--target", str(tmp_path / "sp")]) == 0
    (savepoint,) = (tmp_path / "sp").glob("savepoint-*")
    capsys.readouterr()
    assert run_cli(capsys, "checkpoints", "verify", str(savepoint))[0] == 0
    flip(three / "job" / "chk-3" / "_metadata", 40)
    code, out, _ = run_cli(capsys, "checkpoints", "verify", str(three), "--job", "job", "--json")
    assert code == 1
    results = json.loads(out)
    assert [r["status"] for r in results] == ["verified", "verified", "unreadable"]
    assert [p["file"] for p in results[2]["problems"]] == [f"{three}/job/chk-3/_metadata"]


@pytest.mark.parametrize("action", ["list", "verify"])
def test_nothing_there_exits_2_saying_what_is_there_instead(
    action: str, three: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "a-file").write_text("x")
    (tmp_path / "empty").mkdir()
    cases = [
        ([str(tmp_path / "nope")], f"no checkpoints at {tmp_path / 'nope'}: it does not exist"),
        (
            [str(tmp_path / "a-file")],
            f"no checkpoints at {tmp_path / 'a-file'}: it is a file, not a directory",
        ),
        (
            [str(three), "--job", "nojob"],
            f"job 'nojob' has no completed checkpoint under {three}; jobs with checkpoints there: job",
        ),
        ([str(tmp_path / "empty")], f"no completed checkpoint under {tmp_path / 'empty'}"),
        (
            [str(three / "job")],
            f"it is the directory of job 'job': pass its parent, {three} (with --job job)",
        ),
    ]
    if action == "list":  # verify takes a checkpoint itself
        cases.append(([str(three / "job" / "chk-1")], "it is a checkpoint itself"))
    for argv, message in cases:
        code, out, err = run_cli(capsys, "checkpoints", action, *argv)
        assert (code, out) == (2, ""), argv
        assert err.startswith("statekit: error: ") and message in err and err.count("\n") == 1, err


def test_list_piped_is_tab_separated_and_never_cut(three: Path) -> None:
    for columns in ("40", "80"):
        out = subprocess.run(
            [sys.executable, "-m", "statekit", "checkpoints", "list", str(three)],
            capture_output=True,
            text=True,
            check=True,
            env={"COLUMNS": columns, "PATH": ""},
        ).stdout
        assert "…" not in out
        assert [r["location"] for r in tsv(out)] == [str(three / "job" / f"chk-{i}") for i in (1, 2, 3)]
        assert tsv(out)[0]["operators (parallelism)"] == "__source__ (1), process (2)"


def test_list_on_a_terminal_folds_the_location_and_never_breaks_a_number(three: Path) -> None:
    """A table where it fits with every short word whole; else one record per row, as psql's \\x auto."""
    import io

    from rich.console import Console

    from statekit.cli._cli import CommandContext, build_parser

    def listed(width: int) -> str:
        buf = io.StringIO()
        ctx = CommandContext(console=Console(file=buf, force_terminal=True, width=width, color_system=None))
        args = build_parser().parse_args(["checkpoints", "list", str(three)])
        assert args.run(args, ctx) == 0
        out = buf.getvalue()
        assert "…" not in out
        return out

    wide = listed(130)
    rows = [line for line in wide.splitlines() if line.startswith("│")]
    last_column = "".join(line.split("│")[-2].strip() for line in rows)
    for i in (1, 2, 3):
        assert str(three / "job" / f"chk-{i}") in last_column  # folded over lines, every character there
    # Each row's cells, their lines joined at spaces, are the piped form's: no word was broken.
    piped = io.StringIO()
    args = build_parser().parse_args(["checkpoints", "list", str(three)])
    assert args.run(args, CommandContext(console=Console(file=piped))) == 0
    expected = [line.split("\t")[:-1] for line in piped.getvalue().splitlines()[1:]]
    drawn: list[list[list[str]]] = []
    for line in rows:
        cells = [c.strip() for c in line.split("│")[1:-2]]
        if cells[1]:  # the id column starts a row
            drawn.append([[] for _ in cells])
        for parts, c in zip(drawn[-1], cells, strict=True):
            parts.append(c) if c else None
    assert [[" ".join(parts) for parts in row] for row in drawn] == expected

    narrow = listed(70)  # nine columns do not fit: records, "column  value" lines
    assert "┃" not in narrow and narrow.count("-[ ") == 3
    fields: list[list[str]] = []  # [name, value]; a folded value goes on under the name's blank
    for line in narrow.splitlines():
        if line.startswith("-[ "):
            continue
        name, _, value = line.partition("  ")
        if name.strip():
            fields.append([name.strip(), value.strip()])
        else:
            fields[-1][1] += line.strip()
    assert [v for k, v in fields if k == "location"] == [str(three / "job" / f"chk-{i}") for i in (1, 2, 3)]
    assert [[k, v] for k, v in fields if k != "location"] == [
        [k, v]
        for row in expected
        for k, v in zip(piped.getvalue().split("\n")[0].split("\t"), row, strict=False)
    ]


def test_unknown_storage_option_is_one_line_error_and_good_ones_list_s3(
    s3_endpoint: dict[str, str], capsys: pytest.CaptureFixture[str]
) -> None:
    pytest.importorskip("s3fs")
    url = f"s3://{s3_endpoint['bucket']}/cli-options"
    options = {"client_kwargs": {"endpoint_url": s3_endpoint["endpoint_url"]}, "skip_instance_cache": True}
    r = LocalRunner(
        CountUrls,
        key_selector=lambda rec: rec["url"],
        config={
            "statekit.checkpoints.dir": url,
            "statekit.parallelism": 2,
            "statekit.checkpoint.storage.filesystem.storage-options": json.dumps(options),
        },
    )
    r.run(RecordSource(RECORDS[:200]))  # the end of the input checkpoints: chk-1
    r.close()
    code, out, _ = run_cli(capsys, "checkpoints", "list", url, "--storage-options", json.dumps(options))
    assert code == 0 and [(row["id"], row["status"]) for row in tsv(out)] == [("1", "complete")]
    assert run_cli(capsys, "checkpoints", "verify", url, "--storage-options", json.dumps(options))[0] == 0

    for bogus in ({**options, "endpoint": "x"}, {**options, "client_kwargs": {"endpoint": "x"}}):
        for argv in (["checkpoints", "list", url], ["checkpoints", "inspect", f"{url}/job/chk-1"]):
            code, out, err = run_cli(capsys, *argv, "--storage-options", json.dumps(bogus))
            assert (code, out) == (2, ""), err
            assert err.startswith(f"statekit: error: cannot open s3://{s3_endpoint['bucket']}")
            assert "unexpected keyword argument 'endpoint'" in err and err.count("\n") == 1


def test_relative_paths_are_reported_in_full(
    three: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    victim, _ = flip_a_block(three / "job" / "chk-2")
    monkeypatch.chdir(three)
    code, out, _ = run_cli(capsys, "checkpoints", "verify", "job/chk-2/", "--json")
    (result,) = json.loads(out)
    assert code == 1 and result["location"] == str(three / "job" / "chk-2")
    code, out, _ = run_cli(capsys, "checkpoints", "inspect", "job/chk-1", "--json")
    assert code == 0 and json.loads(out)["location"] == str(three / "job" / "chk-1")
    code, _, err = run_cli(capsys, "savepoint", "convert", "job/chk-2", "--target", "sp", "--no-progress")
    assert code == 2 and err.startswith(f"statekit: error: checkpoint {three}/job/chk-2: {victim}: ")
    assert not (three / "sp").exists()  # a damaged checkpoint is refused before anything is written


def test_convert_draws_its_copy_on_a_terminal_only(three: Path, tmp_path: Path) -> None:
    import io

    from rich.console import Console

    from statekit.cli._cli import CommandContext, build_parser

    for terminal in (True, False):
        out, err = io.StringIO(), io.StringIO()
        ctx = CommandContext(
            console=Console(file=out), err_console=Console(file=err, force_terminal=terminal, width=100)
        )
        target = tmp_path / f"sp-{terminal}"
        args = build_parser().parse_args(
            ["savepoint", "convert", str(three / "job" / "chk-3"), "--target", str(target)]
        )
        assert args.run(args, ctx) == 0
        (savepoint,) = target.glob("savepoint-*")
        assert out.getvalue() == f"savepoint written to {savepoint}\n"
        assert ("copying" in err.getvalue()) is terminal
        assert terminal or err.getvalue() == ""  # a log gets no bar and no blank line


@pytest.mark.parametrize("action", [["checkpoints", "inspect"], ["checkpoints", "verify"], ["state", "list"]])
def test_a_missing_location_at_the_root_is_not_found(
    action: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    code, _, err = run_cli(capsys, *action, "/no-such-statekit-location")
    assert code == 2 and "/no-such-statekit-location" in err and "statekit.checkpoints.dir" not in err


def test_rocksdb_inspect_shows_uploaded_and_referenced_bytes_and_exact_entries(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # The defect: `entries` said 200,000 where the state held 50,000 keys. RocksDB's
    # estimate-num-keys counts a key once per SST file holding a version of it: four checkpoints
    # that update every key leave four versions until compaction. Since issue 43 the backend
    # counts (key, namespace) entries on write, so the CLI shows them exactly, unlabelled.
    pytest.importorskip("statekit_rocksdb")
    r = runner(tmp_path / "ckpt", 1, backend="rocksdb")
    keys = [f"https://example.com/{i}" for i in range(2000)]
    src = RecordSource([{"url": u, "request": "GET", "bytes": 1} for u in keys] * 4)
    chk = ""
    for _ in range(4):
        r.run(src, max_records=len(keys))
        chk = r.checkpoint()
    r.close()
    assert main(["checkpoints", "list", str(tmp_path / "ckpt"), "--json"]) == 0
    newest = json.loads(capsys.readouterr().out)[-1]["operators"]["process"]
    assert newest["entries_estimated"] is False
    # "bytes" holds the operator state too, which is written whole every time.
    assert 0 < newest["uploaded_bytes"] + newest["referenced_bytes"] < newest["bytes"]
    assert main(["checkpoints", "inspect", chk, "--json"]) == 0
    subtask = next(s for s in json.loads(capsys.readouterr().out)["subtasks"] if s["operator"] == "process")
    # Checkpoint 4 references the SST files checkpoints 1-3 uploaded and uploads only its own.
    assert subtask["referenced_bytes"] > 0 and subtask["uploaded_bytes"] > 0
    assert subtask["uploaded_bytes"] + subtask["referenced_bytes"] == subtask["bytes"]
    assert subtask["entries_estimated"] is False
    assert main(["checkpoints", "inspect", chk]) == 0
    out = capsys.readouterr().out
    assert f"{subtask['uploaded_bytes']:,}\t{subtask['referenced_bytes']:,}" in out
    assert "written by this checkpoint" in out and "(estimate)" not in out


def test_canonical_entries_are_counts_and_all_bytes_are_written(
    ckpt: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["checkpoints", "inspect", str(ckpt / "job" / "chk-2"), "--json"]) == 0
    subtasks = [s for s in json.loads(capsys.readouterr().out)["subtasks"] if s["operator"] == "process"]
    assert {(s["entries_estimated"], s["uploaded_bytes"], s["referenced_bytes"]) for s in subtasks} == {
        (False, None, None)
    }
    assert main(["checkpoints", "list", str(ckpt)]) == 0
    assert "(estimate)" not in capsys.readouterr().out


def states_of(out: str) -> dict[str, dict[str, str]]:
    """``inspect``'s table of states (piped: tab-separated), by ``operator/state``."""
    return {row["operator/state"]: row for row in tsv(out.split("\n\n")[1])}


def test_inspect_shows_each_state_of_the_heaps_own_checkpoints_as_the_metrics_do(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # The defect: the heap's base and deltas (its default checkpoints) record each state's entries and
    # bytes, which the metrics showed; `inspect` showed none (its JSON an empty state_bytes).
    infos = default_checkpoints(str(tmp_path / "ckpt"))
    for info in infos:
        metrics = {f"process/{n}": (z.entries, z.bytes) for n, z in info.stats.states.items()}
        assert len(metrics) == 3 and all(b > 0 for _, b in metrics.values())
        code, out, err = run_cli(capsys, "checkpoints", "inspect", info.location, "--json")
        assert code == 0, err
        got = json.loads(out)
        assert {n: (s["entries"], s["bytes"]) for n, s in got["states"].items()} == metrics
        subtasks = [s for s in got["subtasks"] if s["operator"] == "process"]
        assert {s["format"] for s in subtasks} == {"heap-delta-1"}
        for n, (entries, size) in metrics.items():
            name = n.removeprefix("process/")
            assert sum(s["state_entries"][name] for s in subtasks) == entries
            assert sum(s["state_bytes"][name] for s in subtasks) == size
        code, out, err = run_cli(capsys, "checkpoints", "inspect", info.location)
        assert code == 0 and "not recorded" not in out + err
        rows = states_of(out)
        assert {n: (rows[n]["entries"], rows[n]["bytes"]) for n in metrics} == {
            n: (f"{e:,}", f"{b:,}") for n, (e, b) in metrics.items()
        }


@pytest.mark.parametrize("backend", ["rocksdb", "lmdb"])
def test_inspect_says_not_recorded_where_native_snapshots_name_no_per_state_sizes(
    backend: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    pytest.importorskip(f"statekit_{backend}")
    info = default_checkpoints(str(tmp_path / "ckpt"), backend)[-1]
    assert info.stats.states == {}  # the metrics have none either
    code, out, err = run_cli(capsys, "checkpoints", "inspect", info.location, "--json")
    assert code == 0, err
    got = json.loads(out)
    assert {(s["entries"], s["bytes"]) for s in got["states"].values()} == {(None, None)}
    process = [s for s in got["subtasks"] if s["operator"] == "process"]
    assert {(s["state_entries"], s["state_bytes"]) for s in process} == {(None, None)}
    (source,) = (s for s in got["subtasks"] if s["operator"] == "__source__")
    assert (source["state_entries"], source["state_bytes"]) == ({}, {})  # no keyed state: none
    (fmt,) = {s["format"] for s in process}
    code, out, err = run_cli(capsys, "checkpoints", "inspect", info.location)
    assert code == 0, err
    assert {(r["entries"], r["bytes"]) for r in states_of(out).values()} == {("not recorded", "not recorded")}
    assert (
        f"  per state         operator process: entries and bytes per state are not recorded in {fmt} "
        "snapshots; a savepoint of the checkpoint records them (statekit savepoint convert)\n"
    ) in out
