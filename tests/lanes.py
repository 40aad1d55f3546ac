"""Lanes of one process, as `--pairs-per-device` runs them: threads started together and joined."""

from __future__ import annotations

import threading
from collections.abc import Callable


def run_lanes(*lanes: Callable[[], None], timeout_s: float = 10.0) -> None:
    """Run each of `lanes` in a thread of its own, all at once, and wait for every one to end; what a
    lane raised is raised here."""
    raised: list[BaseException] = []

    def run(lane: Callable[[], None]) -> None:
        try:
            lane()
        except BaseException as exc:  # noqa: BLE001 - the test's thread raises it
            raised.append(exc)

    threads = [threading.Thread(target=run, args=(lane,), daemon=True) for lane in lanes]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=timeout_s)
    assert not any(t.is_alive() for t in threads), "a lane never ended"
    if raised:
        raise raised[0]
