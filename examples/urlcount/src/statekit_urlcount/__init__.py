"""The nginx access-log URL count: statekit's example job on Spark.

Records are nginx access-log lines as JSON, e.g.
``{"@timestamp": "18/Apr/2019:00:00:00", "remote_addr": "127.0.0.1", "request": "GET", "url": "/api/a"}``;
the job keeps, per URL, the number of requests so far in statekit keyed state,
checkpointed at the end of each Spark micro-batch, and sends malformed lines to
a dead-letter output. The ``statekit-urlcount`` command generates logs, runs the
job and demonstrates a resume (see docs/urlcount.md).
"""

from __future__ import annotations

from ._function import (
    COUNT_STATE,
    JOB_OUTPUT_SCHEMA,
    OUTPUT_SCHEMA,
    CountPerUrl,
    CountPerUrlWithDeadLetters,
)
from ._generate import MALFORMED_KINDS, GenerateResult, file_name, generate_logs, url_names
from ._job import (
    PARSED_SCHEMA,
    BatchStats,
    JobSettings,
    RunReport,
    StateSummary,
    parse_batches,
    read_state,
    run_job,
    statekit_conf,
)
from ._parse import MALFORMED_KEY, REASONS, AccessRecord, Malformed, parse_line
from ._session import local_spark_session

__all__ = [
    "COUNT_STATE",
    "JOB_OUTPUT_SCHEMA",
    "MALFORMED_KEY",
    "MALFORMED_KINDS",
    "OUTPUT_SCHEMA",
    "PARSED_SCHEMA",
    "REASONS",
    "AccessRecord",
    "BatchStats",
    "CountPerUrl",
    "CountPerUrlWithDeadLetters",
    "GenerateResult",
    "JobSettings",
    "Malformed",
    "RunReport",
    "StateSummary",
    "file_name",
    "generate_logs",
    "local_spark_session",
    "parse_batches",
    "parse_line",
    "read_state",
    "run_job",
    "statekit_conf",
    "url_names",
]
