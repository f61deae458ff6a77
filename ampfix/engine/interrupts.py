"""Signals that never land inside a lock.

Python runs a signal's handler between two bytecodes of the main thread, wherever it is.  When
that handler raises (Ctrl-C's KeyboardInterrupt, SIGTERM's SystemExit) inside
``threading.Condition.wait`` -- right after the condition's lock was let go and before the
``try`` that takes it back -- the ``with`` around the wait then releases a lock it no longer
holds, and the run ends in "RuntimeError: cannot release un-acquired lock" rather than
"interrupted".  Raised right after a ``with lock:`` took its lock, it leaves the lock held, and
whoever takes it next (the pool's reader thread, the pool's close on the way out) waits for ever.

:func:`shielded` holds such signals back for the length of a short section of the main thread
and delivers them at its end, through the handler that was in place: a section that waits
returns within its timeout, so Ctrl-C is still obeyed within a fraction of a second.
"""
from __future__ import annotations

import os
import signal
import threading
from contextlib import contextmanager
from typing import Iterator, List

_SIGNALS = tuple(s for s in (getattr(signal, "SIGINT", None), getattr(signal, "SIGTERM", None)) if s is not None)


@contextmanager
def shielded() -> Iterator[None]:
    """Run the block with SIGINT and SIGTERM held back; deliver those that came at its end."""
    if threading.current_thread() is not threading.main_thread():
        yield  # handlers only ever run in the main thread: nothing can land here
        return
    came: List[int] = []

    def hold(signum, frame):
        came.append(signum)

    old = {}
    try:
        for s in _SIGNALS:
            old[s] = signal.signal(s, hold)
    except (ValueError, OSError):  # an embedding that owns the signals: leave them be
        for s, h in old.items():
            signal.signal(s, h)
        yield
        return
    try:
        yield
    finally:
        for s, h in old.items():
            signal.signal(s, h)
        if came:
            _deliver(came[0], old[came[0]])


def _deliver(signum: int, handler) -> None:
    """What the handler in place would have done had the signal come now."""
    if callable(handler):
        handler(signum, None)
    elif handler == signal.SIG_DFL:
        os.kill(os.getpid(), signum)  # the default action (the handler is back in place)
