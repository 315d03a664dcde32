"""A processing-time clock that tests move by hand."""

from __future__ import annotations

__all__ = ["ManualClock"]


class ManualClock:
    """A clock in milliseconds that only moves when told to.

    Pass it as ``clock=`` to ``create_keyed_backend`` (or a runner) and move time
    with :meth:`advance`; TTL then expires exactly when a test says so. Example::

        clock = ManualClock(1_000)
        backend = factory().create_keyed_backend(KeyedBackendParameters(..., clock=clock))
        clock.advance(60_000)
    """

    def __init__(self, now: int = 1_000) -> None:
        """Starts the clock at ``now`` milliseconds."""
        self.now = now

    def __call__(self) -> int:
        """The current time in milliseconds."""
        return self.now

    def advance(self, ms: int) -> None:
        """Moves time forward by ``ms`` milliseconds (never backwards).

        Raises:
            ValueError: If ``ms`` is negative.
        """
        if ms < 0:
            raise ValueError(f"a clock never goes back; cannot advance by {ms} ms")
        self.now += ms

    def __repr__(self) -> str:
        """Shows the current time."""
        return f"ManualClock({self.now})"
