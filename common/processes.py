"""Child processes that end with their parent: on Linux, a signal the kernel sends a child when the thread that
started it ends, however the parent ends (SIGKILL and the OOM killer included)."""

from __future__ import annotations

import ctypes
import signal
import sys

try:  # loaded at import, not in a child between fork and exec
    _LIBC: ctypes.CDLL | None = ctypes.CDLL(None, use_errno=True) if sys.platform == "linux" else None
except OSError:  # pragma: no cover - no C library to ask
    _LIBC = None
_PR_SET_PDEATHSIG = 1
CAN_DIE_WITH_PARENT = _LIBC is not None  # die_with_parent works here (Linux)


def die_with_parent(sig: signal.Signals) -> None:
    """In a child (Linux only, CAN_DIE_WITH_PARENT), before exec or after: `sig` is sent to it when the thread that
    started it ends, however the parent ends."""
    assert _LIBC is not None
    _LIBC.prctl(_PR_SET_PDEATHSIG, sig)
