"""The memory that the pairs in flight have planned to hold, so that lanes which share it plan within it together.

The lanes of one machine share its host memory, and the lanes of one device (`--pairs-per-device`) its
device memory. A problem's memory plan (`kbv.memory_plan`) is made from what is free when the problem is
prepared. Two lanes that planned at once would each count the same free bytes, and the second to
allocate would run the host or the device out: kbv's own process killed, or a child's out-of-memory
charged to a candidate. So a lane plans inside `planning` (one lane at a time reads what is free and
claims its plan), and each pair *claims* its plan's peak on the resources it uses (the host, its
device) from the moment its plan is made (or, for a problem its lane already holds, when the pair takes
it) until the pair ends. A plan counts as available only what is free less the other pairs' claims.
That errs safe: a claim counts again the bytes its pair has already allocated.

Where a problem does not fit beside the others' claims, its pair waits until it has the room to itself
(`alone`): meanwhile no other lane plans or makes a new claim, the other lanes let go of the problems
they hold as their pairs end, and once no other pair claims anything, the plan is made again against
what is free then. What this does not cover: a lane with no claim keeps the problems it holds (one
with no pair in flight, or whose pair waits at the room to plan or to claim again: it is not waited
for), and a problem a lane holds is claimed again only when its next pair takes it; a refusal made
beside them is a problem failure, tried again when the run resumes.

Every wait here happens outside the device's gate (`kbv.gate.stepped_out`), so a pair that waits never
keeps another from its timed windows, and its seconds count as time waited, not against the pair's
deadline; the room's lock is let go before the gate is taken back. A lane that plans, has a claim, or
has the room to itself never waits to claim: the lanes that wait wait for it, never the other way round.
"""

from __future__ import annotations

import contextlib
import contextvars
import threading
from collections.abc import Callable, Hashable, Iterator, Mapping

from kbv.gate import stepped_out

HOST = "host"  # the resource every lane of a machine shares; a device's is its name ("cuda:0", "cpu")


class Room:
    """The claims of the pairs in flight, per lane and resource (bytes)."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._claims: dict[Hashable, dict[str, int]] = {}
        self._alone: Hashable | None = None  # the lane that has the room to itself
        self._queued: set[Hashable] = set()  # lanes waiting to have it
        self._planner: Hashable | None = None  # the lane reading what is free and claiming its plan
        self.peak: dict[str, int] = {}  # the most claimed at once, per resource (the run's figures)

    def others(self, lane: Hashable, resource: str) -> int:
        """Bytes the other lanes' pairs claim on `resource`."""
        with self._cond:
            return sum(c.get(resource, 0) for other, c in self._claims.items() if other != lane)

    def claimed(self, lane: Hashable) -> dict[str, int]:
        with self._cond:
            return dict(self._claims.get(lane, {}))

    def wanted(self, lane: Hashable) -> bool:
        """Whether another lane waits to have the room to itself (this lane should let go of what it holds)."""
        with self._cond:
            return bool(self._queued - {lane}) or self._alone not in (None, lane)

    def _may_claim(self, lane: Hashable) -> bool:
        if lane in self._claims or lane in (self._planner, self._alone):
            return True  # replacing a claim, or planning, never waits: another lane may be waiting on it
        return self._alone is None and not (self._queued - {lane})

    def _may_plan(self, lane: Hashable) -> bool:
        return self._planner is None and self._may_claim(lane)

    @contextlib.contextmanager
    def planning(self, lane: Hashable) -> Iterator[None]:
        """`lane` alone reads what is free and claims its plan, for the block: two lanes never plan with
        the same free bytes. Waits while another lane plans, or has (or waits to have) the room to itself."""
        with self._cond:
            again = self._planner == lane  # planning again inside its own plan: already the planner
        if again:
            yield
            return
        self._wait_then(lambda: self._may_plan(lane), lambda: setattr(self, "_planner", lane))
        try:
            yield
        finally:
            with self._cond:
                self._planner = None
                self._cond.notify_all()

    def claim(self, lane: Hashable, bytes_by_resource: Mapping[str, int]) -> None:
        """`lane`'s pair will hold up to these bytes (its earlier claim replaced); waits while another
        lane plans, or has (or waits to have) the room to itself. A plan claims inside `planning`."""
        wanted = {r: int(b) for r, b in bytes_by_resource.items() if b > 0}
        self._wait_then(lambda: self._may_claim(lane) and self._planner in (None, lane),
                        lambda: self._record(lane, wanted))

    def _record(self, lane: Hashable, wanted: dict[str, int]) -> None:
        self._claims[lane] = wanted
        for resource in wanted:
            total = sum(c.get(resource, 0) for c in self._claims.values())
            self.peak[resource] = max(self.peak.get(resource, 0), total)

    def _wait_then(self, ready: Callable[[], bool], then: Callable[[], None]) -> None:
        """`then()` under the room's lock once `ready()`; a wait happens outside the device's gate, and
        the room's lock is let go before the gate is taken back (never the other way round)."""
        with self._cond:
            if ready():
                then()
                return
        with stepped_out(), self._cond:
            self._cond.wait_for(ready)
            then()

    def release(self, lane: Hashable) -> None:
        """`lane`'s pair has ended: its claim goes."""
        with self._cond:
            if self._claims.pop(lane, None) is not None:
                self._cond.notify_all()

    @contextlib.contextmanager
    def alone(self, lane: Hashable) -> Iterator[None]:
        """The room to `lane` alone for the block: its own claim dropped, every other lane's ended, and
        no new one made by another lane until the block ends (its own claims it makes as it plans)."""
        with stepped_out(), self._cond:
            self._claims.pop(lane, None)
            self._queued.add(lane)
            self._cond.notify_all()
            try:
                self._cond.wait_for(lambda: self._alone is None)
                self._alone = lane
            finally:
                self._queued.discard(lane)
                self._cond.notify_all()
            try:
                self._cond.wait_for(lambda: not any(c for other, c in self._claims.items() if other != lane))
            except BaseException:
                self._alone = None
                self._cond.notify_all()
                raise
        try:
            yield
        finally:
            with self._cond:
                self._alone = None
                self._cond.notify_all()


_CURRENT: contextvars.ContextVar[tuple[Room, Hashable, str] | None] = contextvars.ContextVar("kbv_room", default=None)


@contextlib.contextmanager
def using(room: Room, lane: Hashable, device: str) -> Iterator[None]:
    """`room` is the current thread's for the block, as lane `lane` on `device`; its claim goes at the end."""
    token = _CURRENT.set((room, lane, device))
    try:
        yield
    finally:
        _CURRENT.reset(token)
        room.release(lane)


def others_claims() -> tuple[int, int]:
    """(device bytes, host bytes) that the other lanes' pairs claim (0, 0 with no room current). On a
    CPU the device is the host: its claims count as host."""
    current = _CURRENT.get()
    if current is None:
        return 0, 0
    room, lane, device = current
    return room.others(lane, device), room.others(lane, HOST)


def planning() -> contextlib.AbstractContextManager[None]:
    """The current lane reads what is free and claims its plan with no other lane planning (`Room.planning`)."""
    return _as_current(Room.planning)


def claim(device_bytes: int, host_bytes: int) -> None:
    """The current pair will hold up to these bytes on its device and the host (nothing with no room current)."""
    current = _CURRENT.get()
    if current is not None:
        room, lane, device = current
        room.claim(lane, {device: device_bytes, HOST: host_bytes})


def sharing() -> bool:
    """Whether another lane's pair claims memory now, or waits to have the room alone."""
    current = _CURRENT.get()
    if current is None:
        return False
    room, lane, device = current
    return room.others(lane, device) > 0 or room.others(lane, HOST) > 0 or room.wanted(lane)


def alone() -> contextlib.AbstractContextManager[None]:
    """The current room to this lane alone for the block (`Room.alone`); no room current: nothing."""
    return _as_current(Room.alone)


@contextlib.contextmanager
def _as_current(enter: Callable[[Room, Hashable], contextlib.AbstractContextManager[None]]) -> Iterator[None]:
    """`enter(room, lane)` of the current room and lane for the block; none current: nothing."""
    current = _CURRENT.get()
    if current is None:
        yield
        return
    room, lane, _ = current
    with enter(room, lane):
        yield
