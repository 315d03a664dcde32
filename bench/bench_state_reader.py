"""State as data: reading a 1M-entry state into Arrow against pickle.load, and point queries.

Prints ratios against baselines measured in the same run:

- ``read``: the whole state (1M string keys, int values, a canonical savepoint
  of 4 files) into one Arrow table with SavepointReader, against
  ``pickle.load`` of the same dict from a local file;
- ``point``: one key's value with ``SavepointReader.get`` (open the metadata,
  then the header and the one key-group block), against reading the whole
  snapshot; bytes read and latency (median over the queries).

    python bench/bench_state_reader.py [--entries 1000000] [--queries 200]
"""

from __future__ import annotations

import argparse
import pickle
import random
import shutil
import statistics
import tempfile
import time
from pathlib import Path

from harness import timed

from statekit import ValueStateDescriptor
from statekit.checkpointing import load_checkpoint
from statekit.state_processor import SavepointReader, SavepointWriter

COUNT = ValueStateDescriptor("count", int, default=0)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--entries", type=int, default=1_000_000)
    ap.add_argument("--queries", type=int, default=200)
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    scratch = Path(tempfile.mkdtemp(prefix="bench-reader-"))
    try:
        rng = random.Random(7)
        counts = {f"/api/v1/resource/{i}": rng.randint(1, 10_000) for i in range(args.entries)}
        t0 = time.perf_counter()
        writer = SavepointWriter.new(max_parallelism=128).with_state("process", COUNT, counts)
        location = writer.write(str(scratch / "sp"), parallelism=4)
        build = time.perf_counter() - t0
        meta = load_checkpoint(SavepointReader.open(location).checkpoint.storage, location).metadata
        snapshot_bytes = sum(int(st.keyed["size"]) for st in meta.operators["process"] if st.keyed)
        pickled = scratch / "counts.pickle"
        with pickled.open("wb") as f:
            pickle.dump(counts, f, protocol=5)

        def load_pickle() -> dict[str, int]:
            with pickled.open("rb") as f:
                out: dict[str, int] = pickle.load(f)
            return out

        def read_arrow() -> tuple[int, int]:
            reader = SavepointReader.open(location)
            table = reader.read_table("process", "count")
            return table.num_rows, reader.bytes_read

        t_pickle, loaded = timed(load_pickle, args.repeats)
        t_arrow, (rows, whole_bytes) = timed(read_arrow, args.repeats)
        assert loaded == counts and rows == len(counts)

        keys = rng.sample(sorted(counts), args.queries)
        cold, warm, sizes, warm_sizes = [], [], [], []
        open_reader = SavepointReader.open(location)
        for k in keys:
            t0 = time.perf_counter()
            reader = SavepointReader.open(location)
            value = reader.get("process", "count", k)
            cold.append(time.perf_counter() - t0)
            assert value == counts[k], (k, value)
            sizes.append(reader.bytes_read)
            before = open_reader.bytes_read
            t0 = time.perf_counter()
            assert open_reader.get("process", "count", k) == counts[k]
            warm.append(time.perf_counter() - t0)
            warm_sizes.append(open_reader.bytes_read - before)

        size = f"{snapshot_bytes / 2**20:.1f} MiB (pickle: {pickled.stat().st_size / 2**20:.1f} MiB)"
        print(
            f"state: {len(counts):,} entries, a canonical savepoint of 4 files, {size}; "
            f"written in {build:.2f} s"
        )
        n = len(counts)
        _table(
            ["read the whole state", "seconds", "entries/s", "ratio"],
            [
                ["pickle.load of the dict (baseline)", f"{t_pickle:.3f}", f"{n / t_pickle / 1e6:.2f}M",
                 "1.00"],
                ["SavepointReader.read_table (Arrow)", f"{t_arrow:.3f}", f"{n / t_arrow / 1e6:.2f}M",
                 f"{t_pickle / t_arrow:.2f}x"],
            ],
        )  # fmt: skip
        cold_b, warm_b = statistics.median(sizes), statistics.median(warm_sizes)
        med_cold, med_warm = statistics.median(cold), statistics.median(warm)
        _table(
            [f"one key ({args.queries} queries, median)", "bytes read", "latency", "vs the whole snapshot"],
            [
                ["whole snapshot (read_table)", f"{whole_bytes:,}", f"{t_arrow * 1e3:.1f} ms", "1"],
                ["get, opening the savepoint each time", f"{cold_b:,.0f}", f"{med_cold * 1e3:.2f} ms",
                 f"1/{whole_bytes / cold_b:,.0f} of the bytes, {t_arrow / med_cold:,.0f}x faster"],
                ["get on an open reader (headers cached)", f"{warm_b:,.0f}", f"{med_warm * 1e3:.2f} ms",
                 f"1/{whole_bytes / warm_b:,.0f} of the bytes, {t_arrow / med_warm:,.0f}x faster"],
            ],
        )  # fmt: skip
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def _table(head: list[str], rows: list[list[str]]) -> None:
    print()
    for row in (head, ["---"] * len(head), *rows):
        print("| " + " | ".join(row) + " |")


if __name__ == "__main__":
    main()
