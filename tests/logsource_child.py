"""The URL count over a LogSource in a process of its own that may SIGKILL itself (test_log_source_stateful).

    python logsource_child.py ROOT [--kill-at N]

Reads ``ROOT/logs`` from the latest checkpoint in ``ROOT/checkpoints``
(a checkpoint every 5 records), dead-letters bad lines into
``ROOT/dead-letters/``, and kills itself with SIGKILL when the N-th
output is emitted. A run that reaches the end writes every URL's count, read
from the state, to ``ROOT/result.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import warnings

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from logfiles import COUNT, CountPerUrl  # noqa: E402
from statekit import InputLostWarning, LocalRunner, LogSource  # noqa: E402

#: The longest line the job reads (statekit.source.max-line-bytes): longer ones are dead letters.
LONG = 2048


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("root")
    ap.add_argument("--kill-at", type=int, default=0)
    args = ap.parse_args()
    emitted = 0

    def sink(_: object) -> None:
        nonlocal emitted
        emitted += 1
        if emitted == args.kill_at:
            os.kill(os.getpid(), signal.SIGKILL)

    runner = LocalRunner(
        CountPerUrl,
        key_selector=lambda r: r["url"],
        job_id="stateful",
        sink=sink,
        config={
            "statekit.checkpoints.dir": os.path.join(args.root, "checkpoints"),
            "statekit.parallelism": 2,
            "statekit.checkpoint.interval-records": 5,
            "statekit.bad-records.policy": "dead-letter",
            "statekit.bad-records.dead-letter-path": os.path.join(args.root, "dead-letters"),
            "statekit.source.max-line-bytes": LONG,
        },
    )
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", InputLostWarning)
        with runner:
            runner.run(LogSource(os.path.join(args.root, "logs"), parse=json.loads), restore="latest")
            counts: dict[str, int] = {}
            for ctx in runner.subtasks:
                kb = ctx.keyed_backend
                state = kb.get_state(COUNT)
                for key in list(kb.keys("count")):
                    kb.set_current_key(key)
                    counts[key] = state.value()
    lost = [str(w.message) for w in caught if issubclass(w.category, InputLostWarning)]
    with open(os.path.join(args.root, "result.json"), "w") as f:
        json.dump({"counts": counts, "lost": lost}, f)


if __name__ == "__main__":
    main()
