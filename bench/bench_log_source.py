"""LogSource's lines per second vs a plain ``for line in open(...)`` loop with ``json.loads``, in one run.

The same nginx-style JSON-lines files (``statekit_urlcount.generate_logs``,
no malformed lines, so the baseline does not stop), read by:

- baseline: ``for line in open(path): json.loads(line)``, file after file;
- LogSource: ``for record, position in LogSource(dir, parse=json.loads).read(None)``
  (identity, fingerprints, strict UTF-8, bad-line handling and a position per
  record included).

Each is timed best-of-N with the GC off and reported as a ratio to the
baseline; the target is at most 1.3x its time. Run:
``python bench/bench_log_source.py [--records N] [--files F] [--repeats R]``.
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile

from harness import best_of

from statekit import LogSource
from statekit_urlcount import generate_logs


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--records", type=int, default=1_000_000)
    ap.add_argument("--files", type=int, default=4)
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-logsource-") as logs:
        generate_logs(logs, records=args.records, files=args.files, malformed_fraction=0.0)
        paths = sorted(os.path.join(logs, name) for name in os.listdir(logs))
        size = sum(os.path.getsize(p) for p in paths)

        def plain(_: object) -> object:
            n = 0
            loads = json.loads
            for path in paths:
                with open(path, encoding="utf-8") as f:
                    for line in f:
                        loads(line)
                        n += 1
            return n

        def source(_: object) -> object:
            n = 0
            for _record, _position in LogSource(logs, parse=json.loads).read(None):
                n += 1
            return n

        t_plain, n_plain = best_of(args.repeats, lambda: None, plain)
        t_source, n_source = best_of(args.repeats, lambda: None, source)
        assert n_plain == n_source == args.records, (n_plain, n_source)
    print(f"{args.records:,} lines in {args.files} files, {size / 1e6:.1f} MB, best of {args.repeats}")
    print(f"{'reader':<34} {'seconds':>8} {'lines/s':>12} {'ratio':>7}")
    for name, t in (("open() + json.loads (baseline)", t_plain), ("LogSource(parse=json.loads)", t_source)):
        print(f"{name:<34} {t:8.3f} {args.records / t:12,.0f} {t / t_plain:6.2f}x")


if __name__ == "__main__":
    main()
