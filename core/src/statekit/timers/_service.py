"""The timer service of one subtask: timers as keyed state, ordered by an in-memory queue.

Each time domain keeps its timers in one internal map state of the subtask's
keyed backend, in the void namespace, under the timer's key. The map's user
key is the timer encoded by :func:`encode_timer`: the timestamp as 8 bytes
big-endian offset by 2**63 (so byte order is time order), then ``0x00`` for
the void namespace or ``0x01`` and the namespace serialized by the function's
``timer_namespace`` serializer; the map's value is ``True``. The state is
declared on first use, so jobs without timers write none.

The queue holds ``(timestamp, key bytes, namespace bytes)`` per live timer, so
timers of one timestamp fire in key-then-namespace byte order: the same order
whatever the history of restores and rescales. Deleted timers stay in the
queue until popped (or until the queue is compacted) and are skipped.
"""

from __future__ import annotations

import heapq
import struct
from collections.abc import Callable, Iterator
from typing import Any

from .._contracts import KeyedStateBackend
from .._errors import SerializationError, StateAccessError
from ..serialization._serializers import BoolSerializer, BytesSerializer, TypeSerializer
from ..state._state import VOID_NAMESPACE, MapStateDescriptor
from ..state._timerstate import TIMER_STATE_NAMES, TIMER_STATE_PREFIX, TimeDomain
from ._eventtime import MIN_WATERMARK

__all__ = [
    "NO_TIMER",
    "TIMER_STATE_NAMES",
    "TIMER_STATE_PREFIX",
    "ProcessingTimeHint",
    "TimeDomain",
    "TimerService",
    "decode_timer",
    "encode_timer",
]


_TS = struct.Struct(">Q")
_OFFSET = 2**63
_VOID = b"\x00"


def _descriptor(domain: TimeDomain) -> MapStateDescriptor[bytes, bool]:
    return MapStateDescriptor(
        TIMER_STATE_NAMES[domain], key_serializer=BytesSerializer(), value_serializer=BoolSerializer()
    )


def encode_timer(timestamp: int, namespace_bytes: bytes) -> bytes:
    """The map user key of a timer: 8 bytes of time order, then the namespace code."""
    return _TS.pack(timestamp + _OFFSET) + namespace_bytes


def decode_timer(code: bytes) -> tuple[int, bytes]:
    """``(timestamp, namespace code)`` of an :func:`encode_timer` key."""
    if len(code) < 9 or code[8] not in (0, 1) or (code[8] == 0 and len(code) != 9):
        raise SerializationError(f"not a timer key: {code[:32]!r}")
    return _TS.unpack_from(code)[0] - _OFFSET, code[8:]


def _check_time(timestamp: Any, what: str) -> int:
    if isinstance(timestamp, bool) or not isinstance(timestamp, int):
        raise TypeError(
            f"{what}: a timer's timestamp is int epoch milliseconds, not {type(timestamp).__name__}"
        )
    if not -_OFFSET <= timestamp < _OFFSET:
        raise ValueError(f"{what}: timestamp {timestamp} is outside the 64-bit range")
    return timestamp


_Entry = tuple[int, bytes, bytes]

#: :attr:`ProcessingTimeHint.earliest` when no processing-time timer is pending.
NO_TIMER = 2**63 - 1


class ProcessingTimeHint:
    """A lower bound of the earliest processing-time timer of a runner's timer services.

    Registering lowers it; deleting and firing leave it, so it may be early, never
    late. A runner reads this one attribute per record instead of asking every
    subtask's queue, and recomputes it (:meth:`TimerService.next_timestamp`)
    only when it is due.
    """

    __slots__ = ("earliest",)

    def __init__(self) -> None:
        self.earliest = NO_TIMER


class _Domain:
    __slots__ = ("live", "queue", "state")

    def __init__(self) -> None:
        self.queue: list[_Entry] = []
        self.live: dict[_Entry, tuple[Any, Any]] = {}
        self.state: Any = None


class TimerService:
    """Register and delete timers for the current key; read processing time and the watermark.

    Functions get it as ``ctx.timer_service`` in ``process`` and ``on_timer``::

        def process(self, record, ctx):
            ctx.timer_service.register_event_time_timer(record["ts"] + 60_000)

        def on_timer(self, timestamp, ctx):
            yield (ctx.current_key, timestamp, ctx.time_domain)

    Registering the same (key, namespace, timestamp) again is a no-op; a timer
    fires once, with its key (and namespace) current. Namespaces other than
    ``VOID_NAMESPACE`` need the function's ``timer_namespace`` (a type or
    :class:`~statekit.serializers.TypeSerializer`).

    The methods without a leading ``register``/``delete``/``current`` are the
    runner's: they restore the queue, advance time and fire what is due.
    """

    def __init__(
        self,
        keyed: KeyedStateBackend,
        key_serializer: TypeSerializer,
        *,
        namespace_serializer: TypeSerializer | None = None,
        processing_time: Callable[[], int],
        hint: ProcessingTimeHint | None = None,
    ) -> None:
        self._keyed = keyed
        self._key_ser = key_serializer
        self._ns_ser = namespace_serializer
        self._processing_time = processing_time
        self._hint = hint or ProcessingTimeHint()
        self._watermark = MIN_WATERMARK
        self._domains = {d: _Domain() for d in TimeDomain}
        # KeyedBackendBase keeps the current key's bytes; other backends get them serialized here.
        self._shared_key_bytes = isinstance(getattr(type(keyed), "current_key_bytes", None), property)
        self._last_key: Any = object()
        self._last_key_bytes = b""
        self._last_ns: Any = VOID_NAMESPACE
        self._last_ns_bytes = _VOID
        self.fired = 0
        """Timers fired so far (both domains)."""

    # --- the function's view ------------------------------------------------------------

    def current_processing_time(self) -> int:
        """The processing time in ms (on Spark: the micro-batch's timestamp, fixed for the batch)."""
        return int(self._processing_time())

    def current_watermark(self) -> int:
        """The event-time watermark in ms (``MIN_WATERMARK`` before any event time is seen)."""
        return self._watermark

    def register_event_time_timer(self, timestamp: int, namespace: Any = VOID_NAMESPACE) -> None:
        """Fire ``on_timer`` once the watermark reaches ``timestamp``."""
        self._register(TimeDomain.EVENT_TIME, _check_time(timestamp, "register_event_time_timer"), namespace)

    def register_processing_time_timer(self, timestamp: int, namespace: Any = VOID_NAMESPACE) -> None:
        """Fire ``on_timer`` once processing time reaches ``timestamp``."""
        t = _check_time(timestamp, "register_processing_time_timer")
        self._register(TimeDomain.PROCESSING_TIME, t, namespace)

    def delete_event_time_timer(self, timestamp: int, namespace: Any = VOID_NAMESPACE) -> None:
        """Remove the current key's event-time timer at ``timestamp`` (if any)."""
        self._delete(TimeDomain.EVENT_TIME, _check_time(timestamp, "delete_event_time_timer"), namespace)

    def delete_processing_time_timer(self, timestamp: int, namespace: Any = VOID_NAMESPACE) -> None:
        """Remove the current key's processing-time timer at ``timestamp`` (if any)."""
        t = _check_time(timestamp, "delete_processing_time_timer")
        self._delete(TimeDomain.PROCESSING_TIME, t, namespace)

    # --- internals ----------------------------------------------------------------------

    def _key_bytes(self) -> tuple[Any, bytes]:
        keyed = self._keyed
        key = keyed.get_current_key()
        if key is None:
            raise StateAccessError("timers need a current key: register them in process or on_timer")
        if self._shared_key_bytes:
            # The backend serialized the key already (once per key switch): reuse its bytes.
            return key, keyed.current_key_bytes  # type: ignore[attr-defined]
        if key is not self._last_key:
            self._last_key_bytes = self._key_ser.serialize(key)
            self._last_key = key
        return key, self._last_key_bytes

    def _ns_bytes(self, namespace: Any) -> bytes:
        if namespace is VOID_NAMESPACE:
            return _VOID
        if namespace is self._last_ns or namespace == self._last_ns:
            # Windows are new objects per record but repeat: equality, not identity, hits.
            return self._last_ns_bytes
        ser = self._ns_ser
        if ser is None:
            raise StateAccessError(
                f"a timer in namespace {namespace!r} needs a namespace serializer: set the function's "
                "timer_namespace class attribute to the namespaces' type (or a TypeSerializer)"
            )
        code = b"\x01" + ser.serialize(namespace)
        self._last_ns, self._last_ns_bytes = namespace, code
        return code

    def _state(self, domain: TimeDomain) -> Any:
        d = self._domains[domain]
        if d.state is None:
            d.state = self._keyed.get_state(_descriptor(domain))
        return d.state

    def _register(self, domain: TimeDomain, timestamp: int, namespace: Any) -> None:
        key, kb = self._key_bytes()
        nb = self._ns_bytes(namespace)
        entry = (timestamp, kb, nb)
        d = self._domains[domain]
        if entry in d.live:
            return
        d.live[entry] = (key, namespace)
        heapq.heappush(d.queue, entry)
        self._state(domain).put(encode_timer(timestamp, nb), True)
        if domain is TimeDomain.PROCESSING_TIME and timestamp < self._hint.earliest:
            self._hint.earliest = timestamp

    def _delete(self, domain: TimeDomain, timestamp: int, namespace: Any) -> None:
        _, kb = self._key_bytes()
        entry = (timestamp, kb, self._ns_bytes(namespace))
        d = self._domains[domain]
        if d.live.pop(entry, None) is None:
            return
        self._state(domain).remove(encode_timer(timestamp, entry[2]))
        if len(d.queue) > 2 * len(d.live) + 64:
            d.queue = list(d.live)  # drop deleted timers' entries, keep memory bounded
            heapq.heapify(d.queue)

    # --- the runner's view ----------------------------------------------------------------

    def restore_timers(self) -> int:
        """Rebuild the queues from the keyed state (after a restore); returns the timers found.

        Reads only the timer states, through the backend's public contract
        (``keys`` and map handles), so it works on every backend.
        """
        found = 0
        keyed = self._keyed
        current = keyed.get_current_key()
        for domain, name in TIMER_STATE_NAMES.items():
            d = self._domains[domain]
            d.queue.clear()
            d.live.clear()
            if not keyed.num_entries(name):
                continue
            state = self._state(domain)
            for key in list(keyed.keys(name)):
                keyed.set_current_key(key)
                kb = self._key_ser.serialize(key)
                for code in list(state.keys()):
                    ts, nb = decode_timer(code)
                    ns = VOID_NAMESPACE if nb == _VOID else self._decode_ns(nb)
                    entry = (ts, kb, nb)
                    d.live[entry] = (key, ns)
                    d.queue.append(entry)
            heapq.heapify(d.queue)
            found += len(d.live)
            if domain is TimeDomain.PROCESSING_TIME and d.queue and d.queue[0][0] < self._hint.earliest:
                self._hint.earliest = d.queue[0][0]
        if current is not None:
            keyed.set_current_key(current)
        return found

    def _decode_ns(self, code: bytes) -> Any:
        if self._ns_ser is None:
            raise StateAccessError(
                "the restored state holds timers in namespaces, but the function declares no "
                "timer_namespace: set it to the namespaces' type (or TypeSerializer) the job used"
            )
        return self._ns_ser.deserialize(code[1:])

    @property
    def watermark(self) -> int:
        """The current watermark (the runner's view of :meth:`current_watermark`)."""
        return self._watermark

    def set_watermark(self, watermark: int) -> None:
        """Move the watermark (never back) without firing anything."""
        if watermark > self._watermark:
            self._watermark = watermark

    def end_of_time_passed(self, watermark: int) -> None:
        """Set the watermark back to ``watermark`` after an end-of-input pass at ``MAX_WATERMARK``.

        The runners fire every timer at the end of a bounded input with the
        watermark at the end of time (``statekit.timers.end-of-input=fire``),
        then call this: the end of time lasts for that pass only, so functions
        that go on over more input (the same subtask, kept for the next batch)
        read the watermark the records made, as a restored run would.
        """
        self._watermark = watermark

    def next_timestamp(self, domain: TimeDomain) -> int | None:
        """The earliest live timer of ``domain``, if any."""
        d = self._domains[domain]
        q = d.queue
        while q and q[0] not in d.live:
            heapq.heappop(q)
        return q[0][0] if q else None

    def pending(self, domain: TimeDomain) -> int:
        """The number of live timers of ``domain``."""
        return len(self._domains[domain].live)

    def due(self, domain: TimeDomain, until: int) -> Iterator[tuple[int, Any, Any]]:
        """Pop the live timers of ``domain`` at or before ``until``, in order, as ``(ts, key, ns)``.

        Each is removed from the state and its key made current before it is
        yielded; timers registered while iterating are included if due.
        """
        d = self._domains[domain]
        q = d.queue
        keyed = self._keyed
        while q and q[0][0] <= until:
            entry = heapq.heappop(q)
            kn = d.live.pop(entry, None)
            if kn is None:
                continue
            key, ns = kn
            keyed.set_current_key(key)
            self._state(domain).remove(encode_timer(entry[0], entry[2]))
            self.fired += 1
            yield entry[0], key, ns

    def timers(self, domain: TimeDomain) -> list[tuple[int, Any, Any]]:
        """Every live timer of ``domain`` as ``(ts, key, ns)``, in firing order (inspection, tests)."""
        d = self._domains[domain]
        return [(e[0], *d.live[e]) for e in sorted(d.live)]
