"""Re-initialising per-process state after ``os.fork`` (gunicorn/uvicorn workers)."""

from __future__ import annotations

import os
import weakref
from collections.abc import Callable
from typing import Any


def after_fork_in_child(obj: Any, reinit: Callable[[Any], None]) -> None:
    """Call ``reinit(obj)`` in a forked child, for as long as ``obj`` lives (held weakly).

    Locks held by other threads at fork time stay held forever in the child, and threads do not survive a
    fork: objects owning either must rebuild them there.
    """
    ref = weakref.ref(obj)

    def _hook() -> None:
        target = ref()
        if target is not None:
            reinit(target)

    os.register_at_fork(after_in_child=_hook)
