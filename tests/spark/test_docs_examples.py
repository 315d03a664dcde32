"""The README's Spark examples and every runnable command of docs/, run as written (issue 33).

The blocks are read from the Markdown (``tests/docblocks.py``: a fence marked
``runnable`` is run here, one marked ``illustrative`` is not), on logs that
``statekit-urlcount generate`` writes, so the docs cannot drift from the code.
What differs from a user's shell, and why:

* one Spark for all: the ``statekit-urlcount`` commands run in this process,
  on a session of the suite's shared SparkContext, instead of starting their
  own (``statekit`` commands run as processes, as typed);
* small data: ``generate --records N`` writes ``N // 50`` lines, ``demo`` gets
  ``--records 4000 --more-records 1000``; the one number the docs show from
  the default logs is checked against the generator's ground truth instead;
* ``pip install`` lines are skipped (the packages are installed here);
* ``/data/ckpt`` (a server's checkpoints directory) is the checkpoints
  directory of ``statekit-urlcount run`` here;
* in the README's Spark blocks, the paths Spark itself resolves (input,
  output, Spark's checkpoint location) are made absolute, because the shared
  JVM started in another directory. statekit's own paths (``read_logs``'
  ``logs/`` among them) stay relative: the driver resolves them.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import shlex
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from docblocks import all_blocks, commands, readme_block
from statekit_urlcount import generate_logs, parse_line

SCALE = 50
DEMO_SIZE = ["--records", "4000", "--more-records", "1000"]


def urlcount(argv: list[str]) -> tuple[int, str]:
    """``statekit-urlcount ARGV`` in this process, scaled down; its exit status and output."""
    from statekit_urlcount._cli import main

    argv = list(argv)
    if argv[0] == "generate" and "--records" in argv:
        i = argv.index("--records") + 1
        argv[i] = str(int(argv[i]) // SCALE)
    elif argv[0] == "generate":
        argv += ["--records", str(100_000 // SCALE)]
    if argv[0] == "demo":
        argv += DEMO_SIZE
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        code = main(argv)
    return code, out.getvalue()


def shell(command: str, cwd: Path) -> tuple[int, str]:
    """``command`` in bash, with this environment's commands first on PATH."""
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"}
    done = subprocess.run(
        ["bash", "-c", command], cwd=cwd, env=env, capture_output=True, text=True, timeout=300
    )
    assert done.returncode in (0, 1), f"{command}: exit {done.returncode}\n{done.stderr}"
    return done.returncode, done.stdout


def truth(logs: Path) -> Counter[str]:
    """Requests per URL in ``logs``, by the parser every job uses."""
    counts: Counter[str] = Counter()
    for path in sorted(logs.iterdir()):
        for line in path.read_text(encoding="utf-8").split("\n")[:-1]:
            parsed = parse_line(line)
            if not hasattr(parsed, "reason"):
                counts[parsed.url] += 1
    return counts


@pytest.fixture
def urlcount_on(session: Any, monkeypatch: pytest.MonkeyPatch) -> Any:
    """``statekit-urlcount`` on a session of the shared SparkContext, which it must not stop."""
    import statekit_urlcount._cli as cli

    monkeypatch.setattr(cli, "local_spark_session", lambda **kw: session)
    monkeypatch.setattr(cli, "active_spark_session", lambda: session)
    return session


def test_every_runnable_command_of_the_docs_runs_as_written(
    urlcount_on: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    # What the recipes of state-as-data.md and operations.md start from: generate and run, with defaults.
    assert urlcount(["generate"])[0] == 0
    assert urlcount(["run"])[0] == 0
    ran = []
    for block in all_blocks():
        if not (block.runnable and block.lang in ("sh", "console")):
            continue
        for command, shown in commands(block):
            where = f"{block.where}: {command}"
            if command.startswith("pip install"):
                continue
            command = command.replace("/data/ckpt", "urlcount-state/statekit-checkpoints")
            if command.startswith("statekit-urlcount "):
                code, out = urlcount(shlex.split(command, comments=True)[1:])
                assert code == 0, f"{where}\n{out}"
            else:
                code, out = shell(command, tmp_path)
                assert code == 0, f"{where}\n{out}"
            if command.startswith("statekit state get "):
                url = shlex.split(command)[-1]
                assert out.strip() == str(truth(tmp_path / "logs")[url]), where
            elif shown:
                assert out.splitlines()[0].split() == shown[0].split(), f"{where}: the header differs"
            ran.append(where)
    assert len(ran) >= 12, ran


def test_the_number_the_docs_show_is_the_default_logs(tmp_path: Path) -> None:
    """state-as-data.md shows one count of the default logs: the generator's, exactly."""
    (block,) = [b for b in all_blocks() if b.runnable and "statekit state get" in b.text]
    ((command, shown),) = commands(block)
    generate_logs(tmp_path / "logs", records=100_000)  # statekit-urlcount generate's defaults
    assert shown == [str(truth(tmp_path / "logs")[shlex.split(command)[-1]])]


def _absolute(code: str, tmp_path: Path, paths: list[str]) -> str:
    for path in paths:
        assert f'"{path}"' in code, path
        code = code.replace(f'"{path}"', json.dumps(str(tmp_path / path)))
    return code


def _finish(query: Any) -> None:
    try:
        query.processAllAvailable()
    finally:
        query.stop()
    assert query.exception() is None


def _letters(directory: Path) -> list[dict[str, Any]]:
    return [json.loads(x) for p in sorted(directory.glob("part-*.json")) for x in p.read_text().splitlines()]


def _counts(session: Any, path: Path) -> dict[str, int]:
    rows = session.read.parquet(str(path)).groupBy("url").max("count").collect()
    return {r[0]: r[1] for r in rows}


def test_the_readme_spark_examples_run_on_generated_logs(
    session: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    generate_logs(tmp_path / "logs", records=3000, files=2, malformed_fraction=0.02)
    namespace: dict[str, Any] = {"__name__": "readme_examples"}
    with contextlib.redirect_stdout(io.StringIO()):
        exec(readme_block("Quickstart").text, namespace)  # noqa: S102 - the README's own code
    namespace["spark"] = session

    # "On Spark": read_logs with the Quickstart's parser counts what the LocalRunner counted (issue 43).
    on_spark = _absolute(
        readme_block("On Spark", 0).text, tmp_path, ["out/counts", "spark-checkpoints/urlcount"]
    )
    exec(on_spark, namespace)  # noqa: S102
    _finish(namespace["query"])
    local = namespace["counts"]
    assert _counts(session, tmp_path / "out/counts") == local == dict(truth(tmp_path / "logs"))
    letters = _letters(tmp_path / "state/spark-dead-letters")  # relative: from the driver's directory
    assert len(letters) == namespace["result"].bad_records > 0 and {x["stage"] for x in letters} == {"parse"}
    assert all(x["line"] and x["file"] and x["offset"] is not None for x in letters)

    # Spark's JSON reader over the same logs counts otherwise, as the README says: 404 is a key "404",
    # "" a key, and a line that is no JSON is a row without a key, dead-lettered.
    json_block = _absolute(
        readme_block("On Spark", 1).text,
        tmp_path,
        ["logs/", "out/counts-json", "spark-checkpoints/urlcount-json"],
    )
    exec(json_block, namespace)  # noqa: S102
    _finish(namespace["query"])
    parsed = session.read.json(str(tmp_path / "logs"), schema="url string, request string")
    expected = {r[0]: r[1] for r in parsed.where("url is not null").groupBy("url").count().collect()}
    nulls = parsed.where("url is null").count()
    counts = _counts(session, tmp_path / "out/counts-json")
    assert nulls > 0 and counts == expected
    extra = 0  # lines Spark keys (a url that is a number, "", an object) and parse_request refuses
    for p in sorted((tmp_path / "logs").iterdir()):
        for line in p.read_text().split("\n")[:-1]:
            with contextlib.suppress(ValueError):
                o = json.loads(line)
                extra += (
                    isinstance(o, dict) and o.get("url") is not None and hasattr(parse_line(line), "reason")
                )
    assert sum(counts.values()) == sum(local.values()) + extra
    keyless = [x for x in _letters(tmp_path / "state/spark-dead-letters") if x["stage"] == "key"]
    assert len(keyless) == nulls
    assert {Path(x["file"]).name for x in keyless} <= {"access-00000.log", "access-00001.log"}
