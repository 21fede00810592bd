"""Run a test's worker on several threads at once and wait for all (imported by the automatic
tracing tests that call one function from many threads; not a test module itself)."""
from __future__ import annotations

import threading
from typing import Any, Callable, Iterable


def run_together(worker: Callable[..., Any], per_thread: Iterable[Any]) -> None:
    """Start one thread per item of `per_thread`, each calling `worker(item)`, then join them all.
    Workers report failures their own way (a list the test asserts empty)."""
    threads = [threading.Thread(target=worker, args=(item,)) for item in per_thread]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
