"""A job whose state grows by 20 KB of incompressible text per record (one key per record)."""

from __future__ import annotations

import hashlib
from collections.abc import Iterable
from typing import Any

from statekit import KeyedProcessFunction, ProcessContext, RuntimeContext, ValueStateDescriptor

VALUE = ValueStateDescriptor("value", str)


def value_of(record: int) -> str:
    """20,000 hex digits, deterministic and incompressible."""
    return "".join(hashlib.sha256(f"{record}-{i}".encode()).hexdigest() for i in range(313))[:20000]


def records(n: int) -> list[int]:
    return list(range(n))


class BigValues(KeyedProcessFunction):
    def open(self, ctx: RuntimeContext) -> None:
        self.value = ctx.get_state(VALUE)

    def process(self, record: Any, ctx: ProcessContext) -> Iterable[Any]:
        self.value.update(value_of(record))
        return ()
