"""SIGTERM (a scheduler's stop, `kill`) ends a study's engines the way Ctrl-C does: the measurement in flight
is dropped and retried when the same command runs again; everything measured before it is kept."""

from __future__ import annotations

import contextlib
import signal
from collections.abc import Iterator
from types import FrameType


def raise_interrupt(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


@contextlib.contextmanager
def sigterm_interrupts() -> Iterator[None]:
    previous = signal.signal(signal.SIGTERM, raise_interrupt)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)
