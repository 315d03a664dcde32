"""Configuration by name: typed options, the core keys, and plugin options.

One set of keys serves everywhere; inside Spark they carry a ``spark.`` prefix,
which :class:`Configuration` strips. Plugins declare their own options as
:class:`ConfigOption` records; their keys are ``statekit.backend.<name>.<option>``
and ``statekit.checkpoint.storage.<name>.<option>``.
"""

from __future__ import annotations

import contextlib
import difflib
import math
import numbers
import os
import re
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import KW_ONLY, dataclass
from types import MappingProxyType
from typing import Any, Literal, Protocol

from .._errors import ConfigurationError
from ._secrets import redact

__all__ = [
    "CORE_OPTIONS",
    "DEFAULT_KEY_CACHE_SIZE",
    "PLUGIN_KEY_PREFIXES",
    "ConfigOption",
    "Configuration",
    "InstalledPlugins",
    "PluginKind",
    "PluginOptions",
    "is_statekit_key",
    "parse_plugin_options",
]

PluginKind = Literal["backend", "storage"]

#: Keys whose key group (and serialized form) a keyed backend remembers (``statekit.key-cache-size``):
#: the one default every runner, parameter object and backend takes.
DEFAULT_KEY_CACHE_SIZE = 131072

#: Where the options of each kind of plugin live; the plugin name follows.
PLUGIN_KEY_PREFIXES: Mapping[PluginKind, str] = MappingProxyType(
    {"backend": "statekit.backend.", "storage": "statekit.checkpoint.storage."}
)

_INTEGER = re.compile(r"[+-]?[0-9]+")
_SIZE = re.compile(r"([0-9]+)\s*(?:([kmgt])(?:i?b)?|b)?", re.IGNORECASE)  # no sign: sizes are >= 0
_MULTIPLES = {"k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}
_TRUE = frozenset({"true", "1", "yes", "on"})
_FALSE = frozenset({"false", "0", "no", "off"})
_OFF = "off"  # the word that turns off an option declared with off=
_EXPECTED: Mapping[type, str] = {
    int: "an integer (no size suffix: this is a count)",
    float: "a number",
    bool: "a boolean (true or false)",
    str: "a string",
}
_EXPECTED_SIZE = "a size in bytes: an integer, optionally with a suffix such as 64mb or 5MiB"


@dataclass(frozen=True)
class ConfigOption:
    """Declares one typed configuration option: its name, type, default and meaning.

    Core options use their full key as ``name``; plugin options use a short name
    (``"block-cache-size"``) that the plugin's key prefix completes.

    An ``int`` is a count (``"1k"`` is refused) unless declared ``byte_size=True``;
    ``minimum`` and ``maximum`` bound ints and floats (inclusive); ``off`` names
    the value that turns an int option off, accepted as itself or as the word
    ``off`` and exempt from the bounds.

    Example::

        ConfigOption("block-cache-size", int, 8 << 20, "Bytes of RocksDB block cache.", byte_size=True)
        ConfigOption("write-buffer-count", int, 2, "Memtables per state.", minimum=1)
        ConfigOption("interval-records", int, 0, "Records between checkpoints.", minimum=1, off=0)
        ConfigOption("max-ratio", float, None, "Share of bad records.", minimum=0.0, maximum=1.0)
        ConfigOption("compression", str, "lz4", "Block compression.", choices=("none", "lz4"))

    Attributes:
        name: The short (plugin) or full (core) name.
        type: ``int``, ``float``, ``bool`` or ``str``.
        default: The value when unset; may be ``None``.
        doc: One or two sentences for users, shown by ``statekit plugins``.
        choices: For ``str`` options, the allowed values, if restricted.
        minimum: For ``int`` and ``float`` options, the smallest value allowed.
        maximum: For ``int`` and ``float`` options, the largest value allowed.
        byte_size: For ``int`` options, a number of bytes: binary size suffixes
            (``"64mb"``) are accepted and the value is never negative.
        off: For ``int`` options, the value meaning "off" (``"off"`` parses to it).

    Raises:
        ConfigurationError: If the declaration is inconsistent (``minimum`` on a
            string, a default out of range, ...).
    """

    name: str
    type: type[int | float | bool | str]
    default: Any = None
    doc: str = ""
    choices: tuple[str, ...] | None = None
    _: KW_ONLY
    minimum: int | float | None = None
    maximum: int | float | None = None
    byte_size: bool = False
    off: int | None = None

    def __post_init__(self) -> None:
        numeric = self.type in (int, float)
        misplaced = [
            what
            for what, wrong in (
                ("choices", self.choices is not None and self.type is not str),
                ("minimum", self.minimum is not None and not numeric),
                ("maximum", self.maximum is not None and not numeric),
                ("byte_size", self.byte_size and self.type is not int),
                ("off", self.off is not None and self.type is not int),
                ("a negative minimum", self.byte_size and (self.minimum or 0) < 0),
            )
            if wrong
        ]
        if misplaced:
            raise ConfigurationError(
                f"option {self.name}: {', '.join(misplaced)} cannot apply to an option of type "
                f"{self.type.__name__}"
            )
        if self.minimum is not None and self.maximum is not None and self.minimum > self.maximum:
            raise ConfigurationError(f"option {self.name}: minimum {self.minimum} > maximum {self.maximum}")
        if self.default is not None:
            self.parse(self.default, self.name)  # a default the option would refuse is a bug

    @property
    def type_name(self) -> str:
        """Describes the accepted values in a few words, for messages and listings.

        Example: ``"int"``, ``"size"``, ``"int >= 1 | off"``, ``"none | lz4"``.
        """
        if self.choices is not None:
            return " | ".join(self.choices)
        name = "size" if self.byte_size else self.type.__name__
        if self.minimum is not None:
            name += f" >= {self.minimum}"
        if self.maximum is not None:
            name += f" <= {self.maximum}"
        return name + (f" | {_OFF}" if self.off is not None else "")

    def parse(self, raw: object, key: str) -> Any:
        """Converts a raw value (often a string from Spark's conf) to the option's type and checks its range.

        Byte sizes also accept binary size suffixes: ``"64mb"``, ``"5 MiB"``, ``"1k"``
        (multiples of 1024); other ints are plain integers. Booleans accept
        true/false, 1/0, yes/no, on/off (as strings; the numbers 1 and 0 are no booleans).

        Args:
            raw: The value as given; ``None`` means unset and yields the default.
            key: The full key, named in the error message.

        Raises:
            ConfigurationError: If ``raw`` does not fit the option's type or
                choices, or out of its range. The message never shows a secret.
        """
        if raw is None:
            return self.default
        value = self._convert(raw)
        if value is None:
            raise ConfigurationError(
                f"invalid value {redact(raw, key)!r} for {key}: expected {self._expected()}"
            )
        if self.off is not None and value == self.off:
            return value
        minimum = 0 if self.byte_size and self.minimum is None else self.minimum
        if minimum is not None and value < minimum:
            wrong = f"at least {minimum}"
        elif self.maximum is not None and value > self.maximum:
            wrong = f"at most {self.maximum}"
        else:
            return value
        alternative = f" or {_OFF}" if self.off is not None else ""
        raise ConfigurationError(f"{key} must be {wrong}{alternative}, not {redact(raw, key)!r}")

    def _expected(self) -> str:
        if self.choices:
            return f"one of {', '.join(self.choices)}"
        if self.byte_size:
            return _EXPECTED_SIZE
        return _EXPECTED[self.type] + (f" or {_OFF}" if self.off is not None else "")

    def _convert(self, raw: object) -> Any:
        # None signals a bad value; no option type has None as a valid parsed value.
        text = raw.strip() if isinstance(raw, str) else None
        if self.type is bool:
            if isinstance(raw, bool):
                return raw
            lowered = (text or "").lower()
            return True if lowered in _TRUE else False if lowered in _FALSE else None
        if isinstance(raw, bool):  # bool is an int subclass, but True is no count
            return None
        if self.type is int:
            if isinstance(raw, numbers.Integral):  # numpy's ints too
                return int(raw)
            text = text or ""
            if self.off is not None and text.lower() == _OFF:
                return self.off
            if not self.byte_size:
                return int(text) if _INTEGER.fullmatch(text) else None
            match = _SIZE.fullmatch(text)
            if match is None:
                return None
            return int(match[1]) * _MULTIPLES.get((match[2] or "").lower(), 1)
        if self.type is float:
            number: float | None = None
            if isinstance(raw, numbers.Real):
                number = float(raw)
            elif text:
                with contextlib.suppress(ValueError):
                    number = float(text)
            # NaN passes every range check, and no option means infinity.
            return number if number is not None and math.isfinite(number) else None
        value = os.fspath(raw) if isinstance(raw, os.PathLike) else raw
        if not isinstance(value, str) or (self.choices is not None and value not in self.choices):
            return None
        return value


CORE_OPTIONS: tuple[ConfigOption, ...] = (
    ConfigOption("statekit.backend", str, "heap",
        "Keyed state backend by name: heap, rocksdb, lmdb or a third-party name."),
    ConfigOption("statekit.checkpoint.storage", str, None,
        "Checkpoint storage by name: jobmanager or filesystem. Unset: filesystem "
        "if statekit.checkpoints.dir is set, else jobmanager."),
    ConfigOption("statekit.checkpoints.dir", str, None,
        "URL or path under which checkpoints are written (fsspec URLs allowed)."),
    ConfigOption("statekit.savepoints.dir", str, None,
        "Default URL or path for savepoints."),
    ConfigOption("statekit.checkpoints.retained", int, 1,
        "Number of completed checkpoints kept; older ones are deleted.", minimum=1),
    ConfigOption("statekit.checkpoints.history.max-entries", int, 100,
        "Checkpoint attempts (completed, failed, subsumed, discarded) the job's checkpoint history "
        "keeps, newest last, next to its checkpoints (statekit checkpoints history reads it); 0 keeps "
        "none.", minimum=0),
    ConfigOption("statekit.checkpoint.format", str, "native",
        "Format of checkpoints: native (the backend's own, incremental where it can; canonical for "
        "backends without one) or canonical. Savepoints are always canonical.",
        choices=("native", "canonical")),
    ConfigOption("statekit.local-dir", str, None,
        "Directory under which on-disk backends keep their working files; unset: the system's "
        "temporary directory (LocalRunner) or Spark's local directories (on Spark)."),
    ConfigOption("statekit.local-recovery", bool, True,
        "On Spark: keep a copy of every checkpoint file a subtask writes (and of the engine files a "
        "restore downloads) in the executor's local directory, so a subtask that lands on another "
        "Python worker of the executor, or comes back to it, restores from local files and downloads "
        "only what is missing (Flink's task-local recovery). Each subtask keeps its last two "
        "snapshots' files; false: every restore reads the checkpoint storage."),
    ConfigOption("statekit.spark.locality", str, "auto",
        "On Spark: run each subtask's task on the executor that ran it last, where its state is "
        "open (as Spark's state stores do), through a small JVM helper that ships in the "
        "statekit-core wheel. auto: on when the helper loads (it fits the running Spark's "
        "major.minor version and its SHA-256), else off with a warning (BatchInfo.locality says "
        "why); on: a helper that does not load is an error; off: Spark places tasks anywhere.",
        choices=("auto", "on", "off")),
    ConfigOption("statekit.spark.cache-output", str, "auto",
        "On Spark: whether a micro-batch's outputs are cached for the sink. auto: only where statekit "
        "itself reads them twice (a late-records sink, Spark Connect); the DataFrame foreach_batch "
        "hands your sink is then not cached, as in Spark's foreachBatch: a sink that runs several "
        "actions on it runs the batch's tasks again for each (restored from the checkpoint, so the "
        "state stays exact), and a batch whose runs give different outputs fails uncommitted. "
        "always: cached in every batch (each batch pays for building the cache).",
        choices=("auto", "always")),
    ConfigOption("statekit.spark.warm-up", bool, True,
        "On Spark: when a query (or a static run) starts, a small job on a thread of its own starts "
        "the application's Python workers and imports statekit, pyarrow, the backend and the storage "
        "in them, while the driver reads the checkpoint and Spark plans the first micro-batch (once "
        "per application; Spark reuses its workers). false: the first batch's tasks start them. "
        "Never from a Spark Connect client, nor with spark.python.worker.reuse=false."),
    ConfigOption("statekit.spark.worker-handoff", bool, True,
        "On Spark: a task whose subtask's state is open in another Python worker of the same "
        "executor hands its rows to that worker over a private Unix socket, instead of restoring "
        "the state where Spark placed it (Spark picks the worker, not statekit). BatchInfo."
        "handed_off counts them; false: such a task restores (from local copies, see "
        "statekit.local-recovery)."),
    ConfigOption("statekit.spark.worker-handoff.timeout", float, 180.0,
        "On Spark: seconds a task that handed its rows to a sibling Python worker waits for any "
        "word from it (output, or the heartbeat it sends while it works) before it fails, naming "
        "the worker; Spark's retry then restores the subtask from the checkpoint. Guards against "
        "a sibling that is stopped or hung; the sibling waits as long for the task's rows, then "
        "drops the subtask and logs it.", minimum=0.1),
    ConfigOption("statekit.spark.connect.start-attempts", int, 3,
        "From a Spark Connect client: times start() asks the server to start a query whose "
        "foreachBatch process did not connect back within the ten seconds Spark gives it (a busy "
        "server; no query started, so asking again is exact). Read from the client's session, "
        "which holds the server's configuration too.", minimum=1),
    ConfigOption("statekit.metrics.enabled", bool, True,
        "Report each completed checkpoint (on Spark: each micro-batch) where operators look: one "
        "line at INFO on the statekit logger, and on Spark a source in the driver's metrics system "
        "(JMX, the Prometheus servlet, any configured sink) and job descriptions in the Spark UI. "
        "false: none of these (BatchInfo and the LocalRunner's CheckpointInfo carry the numbers "
        "either way)."),
    ConfigOption("statekit.metrics.exact-entries", bool, True,
        "Ordered key-value backends (rocksdb, lmdb): count each state's (key, namespace) entries "
        "exactly as writes reach the engine, so state_entries is exact in every channel (as Spark's "
        "spark.sql.streaming.stateStore.rocksdb.trackTotalNumberOfRows). false: the backend instances "
        "of the job keep no counts (no bookkeeping per write) and state_entries is the engine's "
        "estimate, labelled as such (state_entries_exact=0). Heap counts natively, either way."),
    ConfigOption("statekit.checkpoint.interval-records", int, 0,
        "Embedded runner: records between checkpoints; off (or 0, the default) turns periodic "
        "checkpoints off.", minimum=1, off=0),
    ConfigOption("statekit.checkpoint.tolerable-failures", int, None,
        "Embedded runner: checkpoints that may fail in a row; one more fails the job (as Flink's "
        "execution.checkpointing.tolerable-failed-checkpoints). Unset: a failed checkpoint never "
        "fails the job.", minimum=0),
    ConfigOption("statekit.parallelism", int, None,
        "Number of parallel subtasks; unset: the runner decides.", minimum=1),
    ConfigOption("statekit.max-parallelism", int, None,
        "Number of key groups, the upper bound for rescaling; unset: computed from the parallelism.",
        minimum=1),
    ConfigOption("statekit.batch-size", int, 10_000,
        "Embedded runner: records per micro-batch for a KeyedBatchFunction (a due checkpoint also "
        "ends a batch); on Spark a micro-batch is Spark's.", minimum=1),
    ConfigOption("statekit.key-cache-size", int, DEFAULT_KEY_CACHE_SIZE,
        "Entries in the cache of serialized keys and their key groups.", minimum=1),
    ConfigOption("statekit.timers.end-of-input", str, "fire",
        "At the end of a bounded input (LocalRunner.run reaching the end of its source, Spark's "
        "run()): fire fires every pending event-time timer as at the end of time (Flink's end of "
        "input, stop --drain) but keeps the watermark the records made, so a later run over more "
        "input goes on from it; keep leaves the timers for that later run (stop without --drain: "
        "for input that grows, such as logs).",
        choices=("fire", "keep")),
    ConfigOption("statekit.restore.fallback", bool, True,
        "LocalRunner, restore='latest': when the newest checkpoint is damaged (a corrupt or missing "
        "file), restore the next older retained one, with a warning, and report it in "
        "RunResult.skipped_checkpoints; false: fail naming the damaged file. Spark never falls back "
        "(its offset log must match the checkpoint)."),
    ConfigOption("statekit.plugins.strict", bool, False,
        "Fail instead of warning when an installed plugin cannot be loaded."),
    ConfigOption("statekit.bad-records.policy", str, "fail",
        "A record whose line does not parse (or is not UTF-8), whose key cannot be computed or has "
        "the wrong type, or whose columns clash in an Arrow batch: fail stops the job with an error "
        "naming the file, byte offset, line and text; dead-letter skips it into the dead letters.",
        choices=("fail", "dead-letter")),
    ConfigOption("statekit.bad-records.dead-letter-path", str, None,
        "The dead-letter directory: JSON-lines files (stage, error, file, offset, line, raw text, job "
        "id, time), each whole when it appears; made with mode 0700, or an existing one private to "
        "the running user. Embedded runner: published with the checkpoint covering them (exactly "
        "once); Spark: a relative path is taken from the driver's working directory. Keep it outside "
        "the input directory."),
    ConfigOption("statekit.bad-records.max", int, None,
        "With dead-letter: more bad records than this in one run fail the job; unset: no limit.",
        minimum=0),
    ConfigOption("statekit.source.max-line-bytes", int, 4 << 20,
        "Log sources (LogSource, read_logs): the longest line read as a record; a longer line is a bad "
        "record (stage too-long) keeping its first 64 KiB and its length, and the rest of it is skipped "
        "without being held in memory.", minimum=1, byte_size=True),
    ConfigOption("statekit.source.follow-symlinks", bool, False,
        "Log sources: read the files that symlinks among the watched names point to, wherever they are; "
        "false: such a symlink is an error naming it, unless it points to another watched file or is the "
        "path given."),
    ConfigOption("statekit.bad-records.max-ratio", float, None,
        "With dead-letter: a share of bad records among those read in one run (0 to 1) above which "
        "the job fails, checked at each periodic checkpoint and at the end of the input; unset: no limit.",
        minimum=0.0, maximum=1.0),
)  # fmt: skip
_CORE_BY_KEY = {option.name: option for option in CORE_OPTIONS}


def _core_option(key: str) -> ConfigOption:
    option = _CORE_BY_KEY.get(key)
    corrected = None if option is not None else _misspelled_namespace(key)
    if corrected is not None:
        plugin_key = any(corrected.startswith(p) for p in PLUGIN_KEY_PREFIXES.values())
        close = [corrected] if plugin_key else difflib.get_close_matches(corrected, _CORE_BY_KEY, n=1)
        hint = f" Did you mean {close[0]}?" if close else ""
        raise ConfigurationError(
            f"unknown option {key}: keys start with 'statekit.' (or 'spark.statekit.').{hint}"
        )
    if option is None:
        close = difflib.get_close_matches(key, _CORE_BY_KEY, n=1)
        hint = f" Did you mean {close[0]}?" if close else ""
        patterns = [p + "<name>.<option>" for p in PLUGIN_KEY_PREFIXES.values()]
        raise ConfigurationError(
            f"unknown option {key};{hint} valid options: {', '.join([*_CORE_BY_KEY, *patterns])}"
        )
    return option


def _near(word: str, target: str) -> bool:
    # Close enough that no other product's keys come near: "state", "stage", "statestore" do not.
    return difflib.SequenceMatcher(None, word, target).ratio() >= 0.8


def _misspelled_namespace(key: str) -> str | None:
    """``key`` with its namespace corrected to ``statekit.`` if that is misspelled, else None.

    Misspelled: ``StateKit.``, ``statekti.``, a lost dot (``statekitbackend``),
    or a near miss of the ``spark.`` in front of a statekit key (``sprak.statekit.``).
    """
    head, dot, rest = key.partition(".")
    lowered = head.lower()
    if lowered == "statekit":
        return None if head == "statekit" else f"statekit.{rest}"
    if lowered.startswith("statekit"):
        return "statekit." + head[len("statekit") :].lstrip("._-") + dot + rest
    if dot and _near(lowered, "statekit"):
        return f"statekit.{rest}"
    if dot and head != "spark" and _near(lowered, "spark") and is_statekit_key(rest):
        return _misspelled_namespace(rest) or rest
    return None


def is_statekit_key(key: str) -> bool:
    """Whether ``key`` (after any ``spark.`` prefix) is statekit's to check.

    It is when it starts with ``statekit.``, and also when its namespace is a
    near miss (``statekti.``, ``StateKit.``, ``statekitbackend``): such a key is
    kept so that :meth:`Configuration.validate` refuses it instead of ignoring it.
    """
    return key.startswith("statekit.") or _misspelled_namespace(key) is not None


def parse_plugin_options(
    options: Sequence[ConfigOption], raw: Mapping[str, object], where: str, *, key_prefix: str = ""
) -> dict[str, Any]:
    """Validates a plugin's raw options and fills in defaults.

    Args:
        options: The options the plugin declares.
        raw: Given values by short option name.
        where: The plugin as named in messages, e.g. ``"backend 'rocksdb'"``.
        key_prefix: Completes short names to full keys in messages.

    Returns:
        Every declared option by short name, parsed or defaulted.

    Raises:
        ConfigurationError: On an undeclared name (listing the declared ones) or an
            ill-typed or out-of-range value.
    """
    declared = {option.name: option for option in options}
    unknown = sorted(set(raw) - set(declared))
    if unknown:
        valid = ", ".join(f"{o.name} ({o.type_name}, default {o.default!r})" for o in options)
        close = [m for name in unknown for m in difflib.get_close_matches(name, declared, n=1)]
        hint = f" Did you mean {', '.join(key_prefix + name for name in close)}?" if close else ""
        raise ConfigurationError(
            f"unknown option{'s' if len(unknown) > 1 else ''} "
            f"{', '.join(key_prefix + name for name in unknown)};{hint} valid options of {where}: "
            f"{valid or 'none'}"
        )
    return {o.name: o.parse(raw.get(o.name), key_prefix + o.name) for o in options}


class PluginOptions(Protocol):
    """What a plugin declares about its options (:class:`~statekit.backend_api.BackendSpec` is one)."""

    @property
    def options(self) -> Sequence[ConfigOption]:
        """The plugin's options."""
        ...


class InstalledPlugins(Protocol):
    """What :meth:`Configuration.validate` asks of the installed plugins.

    :class:`~statekit.backend_api.PluginRegistry` is one. Configuration sits below the
    registry (the registry parses plugin options with :func:`parse_plugin_options`),
    so it names only what it asks.
    """

    def require_all_loaded(self, reason: str) -> None:
        """Raises :class:`~statekit.errors.PluginError` naming each plugin that failed to load."""
        ...

    def backend_spec(self, name: str) -> PluginOptions:
        """The installed backend ``name``; raises :class:`~statekit.errors.UnknownPluginError` if none."""
        ...

    def storage_spec(self, name: str) -> PluginOptions:
        """The installed checkpoint storage ``name``; raises :class:`~statekit.errors.UnknownPluginError`."""
        ...


class Configuration:
    """An immutable set of ``statekit.*`` keys and their raw values.

    Values stay raw (as given, often strings) until read through :meth:`get` or a
    plugin's factory, so one configuration can carry options of plugins that are
    not installed here until :meth:`validate` is asked.

    Example::

        conf = Configuration.from_mapping(dict(spark.sparkContext.getConf().getAll()))
        conf.validate(default_registry())
        conf.get("statekit.checkpoints.retained")  # -> 1
    """

    __slots__ = ("_values",)

    def __init__(self, values: Mapping[str, object] | None = None) -> None:
        """Builds a configuration; see :meth:`from_mapping` for how keys are read."""
        normalized: dict[str, object] = {}
        for key, value in (values or {}).items():
            full = key.removeprefix("spark.")
            if not is_statekit_key(full):
                continue
            if full in normalized and normalized[full] != value:
                raise ConfigurationError(
                    f"{full} is set twice, with and without 'spark.', to different values"
                )
            normalized[full] = value
        self._values: Mapping[str, object] = MappingProxyType(normalized)

    @classmethod
    def from_mapping(cls, values: Mapping[str, object]) -> Configuration:
        """Reads ``statekit.*`` keys, with or without a ``spark.`` prefix, ignoring others.

        Raises:
            ConfigurationError: If a key is given with and without the prefix, differently.
        """
        return cls(values)

    def with_options(self, values: Mapping[str, object]) -> Configuration:
        """Returns a copy in which ``values`` override this configuration's."""
        return Configuration({**self._values, **Configuration(values)._values})

    def __getitem__(self, key: str) -> object:
        """Returns the raw value of a set full key."""
        return self._values[key]

    def __iter__(self) -> Iterator[str]:
        """Iterates over the set full keys."""
        return iter(self._values)

    def __len__(self) -> int:
        """Counts the set keys."""
        return len(self._values)

    def __repr__(self) -> str:
        """Shows the raw values, secrets redacted (see docs/configuration.md#secrets)."""
        return f"Configuration({redact(dict(self._values))!r})"

    def __reduce__(self) -> tuple[type[Configuration], tuple[dict[str, object]]]:
        """Pickles as a dict: Spark ships configurations to executors; a mappingproxy does not pickle."""
        return (Configuration, (self.as_dict(),))

    def as_dict(self) -> dict[str, object]:
        """Returns the raw values by full key, as a new dict."""
        return dict(self._values)

    def get(self, option: ConfigOption | str) -> Any:
        """Returns the parsed value of a core option (or an option with a full key), or its default.

        Plugin options have short names; read them with :meth:`plugin_options`.

        Raises:
            ConfigurationError: If the key is no core option or its value is ill-typed or out of range.
        """
        if isinstance(option, str):
            option = _core_option(option)
        elif not option.name.startswith("statekit."):  # a short name would silently read as unset
            raise ConfigurationError(
                f"{option.name!r} is no full key; read plugin options with plugin_options()"
            )
        return option.parse(self._values.get(option.name), option.name)

    @property
    def backend_name(self) -> str:
        """The selected keyed state backend."""
        return str(self.get("statekit.backend"))

    @property
    def storage_name(self) -> str:
        """The selected checkpoint storage: explicit, else by whether a checkpoints dir is set."""
        explicit = self.get("statekit.checkpoint.storage")
        return str(explicit or ("filesystem" if self.get("statekit.checkpoints.dir") else "jobmanager"))

    def plugin_options(self, kind: PluginKind, name: str) -> dict[str, object]:
        """Returns the raw options set for one plugin, by short option name."""
        prefix = f"{PLUGIN_KEY_PREFIXES[kind]}{name}."
        return {key[len(prefix) :]: value for key, value in self._values.items() if key.startswith(prefix)}

    def validate(
        self, registry: InstalledPlugins, *, backend_given: bool = False, storage_given: bool = False
    ) -> None:
        """Checks every key and value against the core options and the installed plugins.

        The selected backend and storage must be installed, and so must every plugin
        that has options set, selected or not, so a typo fails here and not later.
        With ``statekit.plugins.strict``, no installed plugin may have failed to load.
        Every runner calls this before it starts.

        Args:
            registry: The installed plugins.
            backend_given: The runner was handed a backend object (``backend=``),
                so the backend this configuration selects by name need not be
                installed. Every key is checked all the same.
            storage_given: The same for the checkpoint storage (``storage=``).

        Raises:
            UnknownPluginError: If a named plugin is not installed.
            ConfigurationError: On an unknown key (listing the valid ones), an
                ill-typed value or one out of range.
            PluginError: In strict mode, naming each plugin that failed to load.
        """
        if self.get("statekit.plugins.strict"):
            # First: a plugin that failed to load is why a name would not be installed.
            registry.require_all_loaded("statekit.plugins.strict is true")
        plugins: set[tuple[PluginKind, str]] = set()
        if not backend_given:
            plugins.add(("backend", self.backend_name))
        if not storage_given:
            plugins.add(("storage", self.storage_name))
        for key in self._values:
            if key in _CORE_BY_KEY:
                self.get(key)
                continue
            for kind, prefix in PLUGIN_KEY_PREFIXES.items():
                name, dot, _ = key.removeprefix(prefix).partition(".")
                if key.startswith(prefix) and dot:
                    plugins.add((kind, name))
                    break
            else:
                _core_option(key)
        for kind, name in sorted(plugins):
            spec = registry.backend_spec(name) if kind == "backend" else registry.storage_spec(name)
            prefix = f"{PLUGIN_KEY_PREFIXES[kind]}{name}."
            parse_plugin_options(
                spec.options, self.plugin_options(kind, name), f"{kind} '{name}'", key_prefix=prefix
            )
