"""``statekit state list|show|get|export``, checked against a model of the job's input."""

from __future__ import annotations

import csv
import io
import json
import re
import shlex
import shutil
from collections import Counter
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq  # type: ignore[import-untyped]
import pytest
from rich.console import Console

from jobs import count_urls_runner, default_checkpoints, expected_counts, make_records, model_state
from statekit import (
    CheckpointInfo,
    EventTime,
    KeyedProcessFunction,
    LocalRunner,
    ProcessContext,
    RecordSource,
    RuntimeContext,
    ValueStateDescriptor,
)
from statekit.backend_api import key_group_for_bytes
from statekit.cli._cli import CommandContext, build_parser, main
from statekit.serialization._serializers import StrSerializer
from statekit.state_processor import SavepointReader

RECORDS = make_records(1200, urls=40, seed=3)
FIRST = 500  # chk-1 holds these records, chk-2 all of them
MODEL = expected_counts(RECORDS)
METHODS = {url: [r["request"] for r in RECORDS if r["url"] == url] for url in MODEL}


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A checkpoints directory: job ``job``'s chk-1 (the first records) and chk-2 (all), and a savepoint."""
    root = tmp_path_factory.mktemp("state")
    r = count_urls_runner(str(root / "ckpt"), {"statekit.checkpoints.retained": 2})
    src = RecordSource(RECORDS)
    r.run(src, max_records=FIRST)
    r.checkpoint()
    r.run(src)  # its end of input takes the final checkpoint, chk-2
    r.savepoint(str(root / "sp"))
    r.close()
    return root / "ckpt"


@pytest.fixture(scope="module")
def sp(ckpt: Path) -> str:
    (location,) = (ckpt.parent / "sp").glob("savepoint-*")
    return str(location)


class Sizes(KeyedProcessFunction):
    """Keyed by int: a value state holding a list (a nested column), and a pending timer per size."""

    def open(self, ctx: RuntimeContext) -> None:
        self.sizes = ctx.get_state(ValueStateDescriptor("sizes", list[int], default=[]))

    def process(self, record: dict[str, Any], ctx: ProcessContext) -> Iterable[Any]:
        self.sizes.update([*self.sizes.value(), record["bytes"]])
        ctx.timer_service.register_event_time_timer(10**12 + record["bytes"])
        return ()


SIZES_RECORDS = [{**r, "ts": i} for i, r in enumerate(make_records(300, seed=5))]


@pytest.fixture(scope="module")
def sizes_sp(tmp_path_factory: pytest.TempPathFactory) -> str:
    root = tmp_path_factory.mktemp("sizes")
    r = LocalRunner(
        Sizes,
        key_selector=lambda r: r["bytes"] % 7,
        key_type=int,
        event_time=EventTime("ts"),
        config={"statekit.checkpoints.dir": str(root / "ckpt"), "statekit.parallelism": 2},
    )
    r.run(SIZES_RECORDS, max_records=len(SIZES_RECORDS))  # not the end of input: timers stay pending
    location = r.savepoint(str(root / "sp"))
    r.close()
    return location


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(["state", *argv])
    out, err = capsys.readouterr()
    return code, out, err


def run_json(capsys: pytest.CaptureFixture[str], *argv: str) -> Any:
    code, out, err = run(capsys, *argv, "--json")
    assert code == 0, err
    return json.loads(out)


def key_group(url: str) -> int:
    return key_group_for_bytes(StrSerializer().serialize(url), 128)


# --- list ---------------------------------------------------------------------------------


def test_list_json_names_every_state_kind_type_and_operator_state(
    sp: str, capsys: pytest.CaptureFixture[str]
) -> None:
    info = run_json(capsys, "list", sp)
    assert (info["kind"], info["job_id"], info["max_parallelism"]) == ("savepoint", "job", 128)
    ops = {o["id"]: o for o in info["operators"]}
    assert set(ops) == {"__source__", "process"}
    process = ops["process"]
    assert (process["parallelism"], process["key_type"], process["timers"]) == (2, "str", [])
    assert process["entries"] == 3 * len(MODEL)
    assert process["operator_states"] == ["rules", "seen_by_subtask"]
    states = {s["name"]: (s["kind"], s["type"], s["ttl"]) for s in process["states"]}
    assert states == {
        "count": ("value", "int", None),
        "last_methods": ("list", "list<str>", None),
        "bytes": ("reducing", "int", None),
    }
    assert all(s["bytes"] > 0 for s in process["states"])
    assert ops["__source__"]["operator_states"] == ["position"]


def test_list_shows_timer_domains_and_the_watermark(
    sizes_sp: str, capsys: pytest.CaptureFixture[str]
) -> None:
    info = run_json(capsys, "list", sizes_sp)
    (process,) = (o for o in info["operators"] if o["id"] == "process")
    assert process["key_type"] == "int"
    assert [(t["domain"], t["state"]) for t in process["timers"]] == [
        ("event-time", "__statekit_timers_event")
    ]
    assert [s["name"] for s in process["states"]] == ["sizes"]  # the timers' internal state is not one
    assert info["watermark"] == len(SIZES_RECORDS) - 1


def test_list_table(sp: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("COLUMNS", "200")  # rich wraps cells to the terminal width
    code, out, err = run(capsys, "list", sp)
    assert code == 0
    # Not a terminal: the title and its lines are notes on stderr, stdout holds the two tables only.
    assert err.startswith("savepoint ") and err.splitlines()[0].endswith(" of job job")
    assert f"location          {sp}" in err
    tables = out.split("\n\n")
    assert len(tables) == 2
    assert tables[0].split("\n")[0].split("\t") == [
        "operator",
        "parallelism",
        "key",
        "entries",
        "bytes",
        "format",
    ]
    assert tables[1].split("\n")[0].split("\t") == [
        "operator",
        "state",
        "kind",
        "type",
        "TTL",
        "entries",
        "bytes",
    ]
    for text in (
        "last_methods",
        "list<str>",
        "reducing",
        "statekit-canonical (heap)",
        "operator state",
        "rules",
    ):
        assert text in out


def states_table(out: str) -> dict[str, dict[str, str]]:
    """``list``'s second table (piped: tab-separated), by state name."""
    header, *rows = out.split("\n\n")[1].splitlines()
    cells = [dict(zip(header.split("\t"), row.split("\t"), strict=True)) for row in rows]
    return {c["state"]: c for c in cells}


@pytest.fixture(scope="module")
def heap_native(tmp_path_factory: pytest.TempPathFactory) -> list[CheckpointInfo]:
    """The heap backend's default checkpoints (a base, then a delta), with the metrics of each."""
    return default_checkpoints(str(tmp_path_factory.mktemp("heap-native") / "ckpt"))


def test_list_shows_each_state_of_the_heaps_own_checkpoints_as_the_metrics_do(
    heap_native: list[CheckpointInfo], monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # The defect: the heap's base and deltas (its default checkpoints) record each state's entries and
    # bytes, which the metrics showed, while `state list` read only a canonical file's and showed 0 bytes.
    monkeypatch.setenv("COLUMNS", "200")
    with SavepointReader.open(heap_native[-1].location) as reader:
        chains = [
            st.keyed["native"]["meta"]["chain"] for st in reader.checkpoint.metadata.operators["process"]
        ]
    assert any(chain[-1]["kind"] == "delta" for chain in chains)  # chk-2 is a delta on chk-1's base
    for info in heap_native:
        metrics = {n: (z.entries, z.bytes) for n, z in info.stats.states.items()}
        assert set(metrics) == {"count", "last_methods", "bytes"} and all(b > 0 for _, b in metrics.values())
        (process,) = (o for o in run_json(capsys, "list", info.location)["operators"] if o["id"] == "process")
        assert process["formats"] == ["heap-delta-1"]
        assert {s["name"]: (s["entries"], s["bytes"]) for s in process["states"]} == metrics
        with SavepointReader.open(info.location) as reader:
            (op,) = (o for o in reader.operators() if o.id == "process")
            assert {s.name: (s.entries, s.bytes) for s in op.states} == metrics
            assert reader.read_table("process", "count").num_rows == metrics["count"][0]  # a row per key
        code, out, err = run(capsys, "list", info.location)
        assert code == 0 and "not recorded" not in out + err
        rows = states_table(out)
        assert {n: (rows[n]["entries"], rows[n]["bytes"]) for n in metrics} == {
            n: (f"{e:,}", f"{b:,}") for n, (e, b) in metrics.items()
        }


@pytest.mark.parametrize("backend", ["rocksdb", "lmdb"])
def test_list_says_not_recorded_where_native_snapshots_name_no_per_state_sizes(
    backend: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # RocksDB's and LMDB's native snapshots name no per-state bytes: `list` showed 0 as if measured.
    pytest.importorskip(f"statekit_{backend}")
    monkeypatch.setenv("COLUMNS", "200")
    info = default_checkpoints(str(tmp_path / "ckpt"), backend)[-1]
    assert info.stats.states == {}  # the metrics have none either
    (process,) = (o for o in run_json(capsys, "list", info.location)["operators"] if o["id"] == "process")
    assert [(s["entries"], s["bytes"]) for s in process["states"]] == [(None, None)] * 3
    with SavepointReader.open(info.location) as reader:
        (op,) = (o for o in reader.operators() if o.id == "process")
        assert {(s.entries, s.bytes) for s in op.states} == {(None, None)}
        fmt = op.formats[0]
    code, out, err = run(capsys, "list", info.location)
    assert code == 0
    rows = states_table(out)
    assert {(rows[n]["entries"], rows[n]["bytes"]) for n in ("count", "last_methods", "bytes")} == {
        ("not recorded", "not recorded")
    }
    assert (rows["rules"]["entries"], rows["rules"]["bytes"]) == ("-", "-")  # operator state: none
    assert (
        f"operator process: entries and bytes per state are not recorded in {fmt} snapshots; "
        "a savepoint of the checkpoint records them (statekit savepoint convert)"
    ) in err
    # The way out the note names: a savepoint of the checkpoint records them.
    assert main(["savepoint", "convert", info.location, "--target", str(tmp_path / "sp")]) == 0
    (sp_location,) = (tmp_path / "sp").glob("savepoint-*")
    capsys.readouterr()
    (process,) = (o for o in run_json(capsys, "list", str(sp_location))["operators"] if o["id"] == "process")
    sizes = {s["name"]: (s["entries"], s["bytes"]) for s in process["states"]}
    assert all(e is not None and e > 0 and b is not None and b > 0 for e, b in sizes.values())
    assert sizes["count"][0] == process["entries"] // 3


# --- show ----------------------------------------------------------------------------------


def test_show_limit_counts_the_rows_only_when_it_has_read_them_all(
    sp: str, capsys: pytest.CaptureFixture[str]
) -> None:
    some = run_json(capsys, "show", sp, "--operator", "process", "--state", "count", "--limit", "5")
    assert some["columns"] == ["key", "value", "key_group"]
    assert len(some["rows"]) == 5 and some["total"] is None  # more rows, not counted
    assert all(r["value"] == MODEL[r["key"]] and r["key_group"] == key_group(r["key"]) for r in some["rows"])

    every = run_json(capsys, "show", sp, "--operator", "process", "--state", "count", "--limit", "0")
    assert every["total"] == len(MODEL)
    assert {r["key"]: r["value"] for r in every["rows"]} == MODEL
    assert every["rows"][:5] == some["rows"]  # key-group order, both times

    exact = run_json(
        capsys, "show", sp, "--operator", "process", "--state", "count", "--limit", str(len(MODEL))
    )
    assert exact["total"] == len(MODEL)  # the limit was the whole state: one more block said so


def test_show_key_and_key_group_filters(sp: str, capsys: pytest.CaptureFixture[str]) -> None:
    a, b = "/api/0", "/api/7"
    rows = run_json(
        capsys,
        "show",
        sp,
        "--operator",
        "process",
        "--state",
        "last_methods",
        "--key",
        a,
        "--key",
        b,
        "--limit",
        "0",
    )
    assert rows["total"] == len(METHODS[a]) + len(METHODS[b])
    for url in (a, b):
        mine = [r for r in rows["rows"] if r["key"] == url]
        assert [r["value"] for r in sorted(mine, key=lambda r: r["position"])] == METHODS[url]

    g = key_group("/api/3")
    rows = run_json(
        capsys, "show", sp, "--operator", "process", "--state", "count", "--key-group", str(g), "--limit", "0"
    )
    assert {r["key"]: r["value"] for r in rows["rows"]} == {
        u: n for u, n in MODEL.items() if key_group(u) == g
    }


def test_show_table_says_there_are_more_rows(sp: str) -> None:
    buf = io.StringIO()
    ctx = CommandContext(console=Console(file=buf, force_terminal=True, width=200, color_system=None))
    args = build_parser().parse_args(
        ["state", "show", sp, "--operator", "process", "--state", "bytes", "--limit", "3"]
    )
    assert args.run(args, ctx) == 0
    lines = buf.getvalue().splitlines()
    assert lines[0] == f"process/bytes of {sp}"
    assert lines[-1] == "first 3 rows; there are more (--limit 0 shows and counts all)"
    shown = [line.split("│")[1:3] for line in lines if line.startswith("│")]
    totals = {u: b for u, (_, _, b) in model_state(RECORDS).items()}
    assert [(k.strip(), int(v)) for k, v in shown] == [(k.strip(), totals[k.strip()]) for k, _ in shown]
    assert len(shown) == 3


def test_show_piped_is_only_tab_separated_rows_notes_on_stderr(
    sp: str, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, err = run(capsys, "show", sp, "--operator", "process", "--state", "bytes", "--limit", "3")
    assert code == 0
    header, *rows = out.splitlines()
    assert header == "key\tvalue\tkey_group"
    totals = {u: b for u, (_, _, b) in model_state(RECORDS).items()}
    cells = [row.split("\t") for row in rows]
    assert len(cells) == 3
    assert cells == [[key, str(totals[key]), str(key_group(key))] for key, _, _ in cells]
    assert err.splitlines() == [
        f"process/bytes of {sp}",
        "first 3 rows; there are more (--limit 0 shows and counts all)",
    ]


ODD_KEYS = ["\x00malformed", "tab\there", "esc\x1b[31mred\x1b[0m", "new\nline", "bidi\u202eevil", "plain"]


@pytest.fixture(scope="module")
def odd_sp(tmp_path_factory: pytest.TempPathFactory) -> str:
    """A savepoint whose keys hold control characters (the URL count's ``"\\u0000malformed"`` among them)."""
    root = tmp_path_factory.mktemp("odd")
    r = count_urls_runner(str(root / "ckpt"))
    r.run(RecordSource([{"url": k, "request": "GET", "bytes": 1} for k in ODD_KEYS]))
    location = r.savepoint(str(root / "sp"))
    r.close()
    return location


ESCAPED = {
    "\x00malformed": "\\u0000malformed",
    "tab\there": "tab\\there",
    "esc\x1b[31mred\x1b[0m": "esc\\u001b[31mred\\u001b[0m",
    "new\nline": "new\\nline",
    "bidi\u202eevil": "bidi\\u202eevil",
    "plain": "plain",
}


def no_control_characters(text: str, allowed: str = "\n") -> bool:
    return not any(
        (ord(c) < 32 and c not in allowed) or 0x7F <= ord(c) <= 0x9F or c == "\u202e" for c in text
    )


def test_show_escapes_control_characters_in_keys_piped_and_on_a_terminal(
    odd_sp: str, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, _ = run(capsys, "show", odd_sp, "--operator", "process", "--state", "count", "--limit", "0")
    assert code == 0 and no_control_characters(out, allowed="\n\t")  # tabs separate the cells
    header, *rows = out.splitlines()
    assert header == "key\tvalue\tkey_group"
    assert all(row.count("\t") == 2 for row in rows)  # a key's tab does not make a column
    assert sorted(r.split("\t")[0] for r in rows) == sorted(ESCAPED.values())

    buf = io.StringIO()
    ctx = CommandContext(console=Console(file=buf, force_terminal=True, width=120, color_system=None))
    args = build_parser().parse_args(
        ["state", "show", odd_sp, "--operator", "process", "--state", "count", "--limit", "0"]
    )
    assert args.run(args, ctx) == 0
    shown = buf.getvalue()
    assert no_control_characters(shown)
    keys = {line.split("│")[1].strip() for line in shown.splitlines() if line.startswith("│")}
    assert set(ESCAPED.values()) <= keys

    # --json keeps the exact keys, as JSON
    info = run_json(capsys, "show", odd_sp, "--operator", "process", "--state", "count", "--limit", "0")
    assert sorted(r["key"] for r in info["rows"]) == sorted(ODD_KEYS)


def test_get_miss_escapes_what_it_quotes(odd_sp: str, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run(capsys, "get", odd_sp, "--operator", "process", "--state", "count", "no\x1b[2Jkey")
    assert (code, out) == (1, "")
    assert no_control_characters(err) and "'no\\x1b[2Jkey'" in err
    assert run(capsys, "get", odd_sp, "--operator", "process", "--state", "count", "\x00malformed")[:2] == (
        0,
        "1\n",
    )


def test_show_operator_state_and_timers(sp: str, sizes_sp: str, capsys: pytest.CaptureFixture[str]) -> None:
    rules = run_json(capsys, "show", sp, "--operator", "process", "--state", "rules")
    assert (rules["rows"], rules["total"]) == ([{"key": "version", "value": "1"}], 1)
    seen = run_json(capsys, "show", sp, "--operator", "process", "--state", "seen_by_subtask", "--limit", "0")
    assert Counter(r["value"] for r in seen["rows"]) == Counter(key_group(u) // 64 for u in MODEL)

    timers = run_json(
        capsys, "show", sizes_sp, "--operator", "process", "--timers", "event-time", "--limit", "0"
    )
    want = {(r["bytes"] % 7, 10**12 + r["bytes"]) for r in SIZES_RECORDS}
    assert {(t["key"], t["timestamp"]) for t in timers["rows"]} == want and timers["total"] == len(want)


# --- get -----------------------------------------------------------------------------------


def test_get_hit_prints_the_value_and_reads_one_block(sp: str, capsys: pytest.CaptureFixture[str]) -> None:
    url = "/api/5"
    assert run(capsys, "get", sp, "--operator", "process", "--state", "count", url) == (
        0,
        f"{MODEL[url]}\n",
        "",
    )
    code, out, _ = run(capsys, "get", sp, "--operator", "process", "--state", "last_methods", url)
    assert (code, json.loads(out)) == (0, METHODS[url])

    got = run_json(capsys, "get", sp, "--operator", "process", "--state", "count", url)
    keyed_bytes = sum(p.stat().st_size for p in Path(sp).glob("*.keyed"))
    assert 0 < got.pop("bytes_read") < keyed_bytes / 2  # a header and one block, not the files
    assert got == {"key": url, "value": MODEL[url], "location": sp}


def test_get_miss_is_exit_1_with_a_clear_message(sp: str, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run(capsys, "get", sp, "--operator", "process", "--state", "count", "/nope")
    assert (code, out) == (1, "")
    assert err == f"statekit: no value for key '/nope' in state 'count' of operator 'process' in {sp}\n"


def test_get_with_job_reads_the_latest_checkpoint(ckpt: Path, capsys: pytest.CaptureFixture[str]) -> None:
    early = expected_counts(RECORDS[:FIRST])
    url = next(u for u in MODEL if MODEL[u] != early[u])
    got = run_json(capsys, "get", str(ckpt), "--job", "job", "--operator", "process", "--state", "count", url)
    assert (got["value"], got["location"]) == (MODEL[url], f"{ckpt}/job/chk-2")
    old = run_json(capsys, "get", f"{ckpt}/job/chk-1", "--operator", "process", "--state", "count", url)
    assert old["value"] == early[url]


def test_get_infers_an_int_key_from_the_key_serializer(
    sizes_sp: str, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, _ = run(capsys, "get", sizes_sp, "--operator", "process", "--state", "sizes", "3")
    assert (code, json.loads(out)) == (0, [r["bytes"] for r in SIZES_RECORDS if r["bytes"] % 7 == 3])
    code, _, err = run(
        capsys, "get", sizes_sp, "--operator", "process", "--state", "sizes", "3", "--key-type", "str"
    )
    assert code == 2
    assert err.startswith("statekit: error: key '3' read as str is no key of the state's key serializer int")


# --- export --------------------------------------------------------------------------------


def read_back(path: Path, fmt: str) -> list[dict[str, Any]]:
    if fmt == "json":
        return [json.loads(line) for line in path.read_text().splitlines()]
    if fmt == "csv":
        return [
            {k: int(v) if k != "key" else v for k, v in row.items()}
            for row in csv.DictReader(io.StringIO(path.read_text()))
        ]
    rows: list[dict[str, Any]] = pq.read_table(path).to_pylist()
    return rows


@pytest.mark.parametrize("fmt", ["json", "csv", "parquet"])
def test_export_reads_back_equal_to_the_model(
    sp: str, fmt: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / f"count.{fmt}"
    code, stdout, _ = run(
        capsys,
        "export",
        sp,
        "--operator",
        "process",
        "--state",
        "count",
        "--output",
        str(out),
        "--format",
        fmt,
        "--no-progress",
    )
    assert (code, stdout) == (0, f"{len(MODEL)} rows written to {out} ({fmt})\n")
    rows = read_back(out, fmt)
    assert {r["key"]: r["value"] for r in rows} == MODEL
    assert all(r["key_group"] == key_group(r["key"]) for r in rows)
    assert [r["key_group"] for r in rows] == sorted(r["key_group"] for r in rows)  # streamed by key group


def test_export_json_of_a_filtered_list_state(
    sp: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "methods.jsonl"  # the format follows the suffix
    urls = ["/api/1", "/api/2"]
    code, _, _ = run(
        capsys,
        "export",
        sp,
        "--operator",
        "process",
        "--state",
        "last_methods",
        "-o",
        str(out),
        "--key",
        *urls,
        "--no-progress",
    )
    assert code == 0
    rows = read_back(out, "json")
    got = {u: [r["value"] for r in rows if r["key"] == u] for u in urls}
    assert got == {u: METHODS[u] for u in urls}


def test_export_csv_refuses_nested_columns(
    sizes_sp: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "sizes.csv"
    code, _, err = run(
        capsys,
        "export",
        sizes_sp,
        "--operator",
        "process",
        "--state",
        "sizes",
        "-o",
        str(out),
        "--format",
        "csv",
    )
    assert code == 2 and not out.exists()
    assert err == (
        "statekit: error: process/sizes has nested columns, which CSV cannot hold: "
        "value (list<element: int64>); export it with --format json or --format parquet\n"
    )
    assert (
        run(
            capsys,
            "export",
            sizes_sp,
            "--operator",
            "process",
            "--state",
            "sizes",
            "-o",
            str(tmp_path / "s.parquet"),
            "--no-progress",
        )[0]
        == 0
    )
    by_key = {r["key"]: r["value"] for r in pq.read_table(tmp_path / "s.parquet").to_pylist()}
    assert by_key == {k: [r["bytes"] for r in SIZES_RECORDS if r["bytes"] % 7 == k] for k in range(7)}


def test_export_of_a_corrupt_block_fails_naming_file_and_key_group_and_leaves_no_file(
    sp: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bad = tmp_path / "bad"
    shutil.copytree(sp, bad)
    meta = json.loads((bad / "_metadata").read_bytes()[8:-4])
    keyed = meta["operators"]["process"][1]["keyed"]
    kg, (offset, length) = sorted(keyed["offsets"].items(), key=lambda kv: int(kv[0]))[1]
    victim = bad / keyed["handle"]["path"]
    data = bytearray(victim.read_bytes())
    data[offset + length // 2] ^= 1
    victim.write_bytes(bytes(data))
    out = tmp_path / "count.parquet"
    code, _, err = run(
        capsys,
        "export",
        str(bad),
        "--operator",
        "process",
        "--state",
        "count",
        "-o",
        str(out),
        "--no-progress",
    )
    assert code == 2 and not out.exists() and list(tmp_path.glob(".count.parquet*")) == []
    # The full location: the checkpoint's directory and the file's full path, as everywhere.
    assert err.startswith(f"statekit: error: checkpoint {bad}: {victim}: ")
    assert f"key group {kg}" in err
    assert err.count("\n") == 1


def test_export_refuses_to_replace_a_file_unless_told_to(
    sp: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "count.json"
    out.write_text("precious\n")
    argv = ["export", sp, "--operator", "process", "--state", "count", "-o", str(out), "--no-progress"]
    code, stdout, err = run(capsys, *argv)
    assert (code, stdout) == (2, "")
    assert err == f"statekit: error: {out} exists; pass --overwrite to replace it\n"
    assert out.read_text() == "precious\n" and sorted(p.name for p in tmp_path.iterdir()) == ["count.json"]

    assert run(capsys, *argv, "--overwrite")[0] == 0
    assert {r["key"]: r["value"] for r in read_back(out, "json")} == MODEL

    (tmp_path / "dir.json").mkdir()
    code, _, err = run(capsys, *argv[:-3], "-o", str(tmp_path / "dir.json"), "--overwrite", "--no-progress")
    assert code == 2 and err == f"statekit: error: cannot write {tmp_path / 'dir.json'}: it is a directory\n"


def test_export_never_replaces_a_file_made_while_it_ran(
    sp: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import statekit.cli._state_export as state_export

    out = tmp_path / "count.json"
    real = state_export.ExportWriter.close

    def close_then_someone_writes(self: Any) -> None:
        real(self)
        out.write_text("written meanwhile\n")

    monkeypatch.setattr(state_export.ExportWriter, "close", close_then_someone_writes)
    code, _, err = run(
        capsys, "export", sp, "--operator", "process", "--state", "count", "-o", str(out), "--no-progress"
    )
    assert code == 2 and "exists (it was made during the export); pass --overwrite" in err
    assert out.read_text() == "written meanwhile\n" and [p.name for p in tmp_path.iterdir()] == ["count.json"]


def test_export_draws_blocks_done_of_total(sp: str, tmp_path: Path) -> None:
    buf = io.StringIO()
    ctx = CommandContext(err_console=Console(file=buf, force_terminal=True, width=120))
    out = tmp_path / "count.json"
    args = build_parser().parse_args(
        ["state", "export", sp, "--operator", "process", "--state", "count", "-o", str(out)]
    )
    run_command = args.run
    assert run_command(args, ctx) == 0
    blocks = len({key_group(u) for u in MODEL})
    assert f"{blocks}/{blocks}" in buf.getvalue() and "key-group blocks" in buf.getvalue()


# --- errors --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (
            ["--operator", "nope", "--state", "count"],
            "has no operator 'nope'; its operators: __source__, process",
        ),
        (
            ["--operator", "process", "--state", "nope"],
            "has no keyed state 'nope'; its states: bytes, count, last_methods",
        ),
        (
            ["--operator", "process", "--state", "count", "--key-group", "128"],
            "key group 128 is out of range",
        ),
        (
            ["--operator", "process", "--state", "rules", "--key", "x"],
            "process/rules (operator state) is read whole",
        ),
    ],
)
def test_errors_are_one_line_and_status_2(
    sp: str, argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, err = run(capsys, "show", sp, *argv)
    assert (code, out) == (2, "")
    assert err.startswith("statekit: error: ") and message in err and err.count("\n") == 1


def test_no_checkpoint_is_a_clear_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run(capsys, "list", str(tmp_path / "nothing"))
    assert code == 2 and "no completed checkpoint or savepoint at" in err
    code, _, err = run(capsys, "get", str(tmp_path), "--job", "nojob", "--operator", "p", "--state", "s", "k")
    assert code == 2 and "job 'nojob' has no completed checkpoint" in err


def test_without_pyarrow_every_other_command_works_and_state_says_what_to_install() -> None:
    import subprocess
    import sys

    code = (
        "import sys; sys.modules['pyarrow'] = None\n"
        "from statekit.cli import _cli\n"
        "assert _cli.main(['plugins', '--json']) == 0\n"
        "sys.exit(_cli.main(['state', 'list', 'anywhere']))\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 2, done.stderr
    wanted = 'pip install --find-links wheelhouse -c wheelhouse/constraints.txt "statekit[arrow]"'
    assert wanted in done.stderr


# --- the docs and the commands agree ---------------------------------------------------------

ROOT = Path(__file__).resolve().parents[1]


def documented_command_lines() -> list[tuple[str, list[str]]]:
    """Every concrete ``statekit`` command in the docs' code blocks (not synopses), split as a shell would.

    A ``text`` block is output, not commands: a line of it that starts with ``statekit``
    (a Spark job's description, ``statekit urls batch 2: sink``) is not a command,
    unless it is typed at a prompt (``$ statekit ...``).
    """
    found = []
    for doc in [*sorted((ROOT / "docs").glob("*.md")), ROOT / "README.md"]:
        fenced, output = False, False
        for line in doc.read_text().splitlines():
            if line.startswith("```"):
                fenced = not fenced
                output = fenced and line[3:].split(" ")[0] == "text"
                continue
            typed = line.strip().startswith("$ ")
            text = line.strip().removeprefix("$ ")
            if not fenced or not text.startswith("statekit ") or (output and not typed):
                continue
            text = re.split(r" #| \| | \|\| ", text)[0]
            if re.search(r"[\[\]<>…]|\b[A-Z]{3,}\b|\w\|\w", text):  # a synopsis: placeholders, choices
                continue
            found.append((doc.name, shlex.split(text)[1:]))
    return found


def test_the_docs_commands_parse_and_use_the_examples_job_and_directory() -> None:
    urlcount_cli = pytest.importorskip("statekit_urlcount._cli")
    from statekit_urlcount import JobSettings

    state_dir = urlcount_cli.build_parser().parse_args(["run"]).state
    settings = JobSettings(logs_dir="logs", state_dir=state_dir)
    commands = documented_command_lines()
    assert {doc for doc, _ in commands} >= {"state-as-data.md", "operations.md"}
    for doc, argv in commands:
        try:
            args = build_parser().parse_args(argv)
        except SystemExit:
            pytest.fail(f"{doc}: `statekit {shlex.join(argv)}` is no valid command")
        if getattr(args, "job", None) is not None and not args.job.startswith("$"):
            assert args.job == settings.job_id, (doc, argv)
        where = getattr(args, "location", None) or getattr(args, "path", None) or ""
        if where.startswith(state_dir):
            assert where == settings.statekit_checkpoints, (doc, argv)
    with_job = [argv for doc, argv in commands if doc == "state-as-data.md" and "--job" in argv]
    assert len(with_job) >= 3


def test_plugins_takes_no_storage_options_and_the_docs_do_not_say_it_does(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main(["plugins", "--storage-options", "{}"]) == 2
    assert "unrecognized arguments: --storage-options" in capsys.readouterr().err
    operations = (ROOT / "docs" / "operations.md").read_text()
    assert "Every command takes `--storage-options" not in operations
    assert "`plugins` reads none and takes none" in operations


def test_a_relative_location_is_reported_in_full(
    sp: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.chdir(Path(sp).parent)
    got = run_json(capsys, "get", Path(sp).name, "--operator", "process", "--state", "count", "/api/5")
    assert (got["location"], got["value"]) == (sp, MODEL["/api/5"])
