"""Keep the scheduler's resident memory honest: freed buffers go back to the OS.

The scheduler moves timers through in large buffers (an intake read or a deliver request is up
to a few MiB). glibc raises its mmap threshold after such a buffer is freed, so the next ones
come from the heap, which fragments and never shrinks: resident memory would wander upwards by
a few MiB with nothing alive. A fixed threshold keeps every buffer of 128 KiB or more in its own
mapping, unmapped when freed. Linux/glibc only; elsewhere nothing changes.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging
import sys

log = logging.getLogger(__name__)

M_MMAP_THRESHOLD = -3  # glibc mallopt parameter
MMAP_THRESHOLD = 128 * 1024  # bytes; glibc's initial value, pinned so glibc never raises it


def pin_mmap_threshold() -> bool:
    """True when glibc's mmap threshold is now fixed at MMAP_THRESHOLD."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        done = bool(libc.mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD))
    except (OSError, AttributeError):
        done = False
    if not done:
        log.info("could not fix the allocator's mmap threshold (not glibc?): resident memory "
                 "may include freed buffers")
    return done
