"""When a schedule's ticks fall, and which due ticks a scheduler pass fires.

Ticks of `every: n` are the instants whose Unix time is a multiple of n seconds
(`every: 60` fires at each whole minute, `every: 1` at each whole second); the time
zone plays no part. Ticks of `cron` come from croniter in the schedule's time zone,
and each wall-clock time the expression matches fires once:

    spring forward  wall-clock times that do not exist that day (02:00-02:59 in
                    Europe/Berlin on the last Sunday of March) fire once, at the first
                    instant after the gap (03:00 CEST); several of them ("*/15 * * * *")
                    fall on that one instant and fire once together
    fall back       wall-clock times that occur twice (02:00-02:59 on the last Sunday of
                    October) fire at their first occurrence (CEST) only

The catch-up rules, for a pass at instant `now` (the database clock) with ticks due
since the cursor (the oldest tick not yet settled):

    on time         a due tick at most `grace` old: always fired
    skip            missed ticks (older than `grace`) are dropped
    latest          only when no tick is on time, the newest missed tick is fired
    all-bounded     the newest `limit` due ticks are fired, oldest first; older ones dropped

A tick refused at the backlog cap stays due: the next pass applies the same rules to it.
"""

from __future__ import annotations

import itertools
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from enum import StrEnum
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from croniter import CroniterBadDateError, croniter

from queue_server import errors

EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
MICRO = timedelta(microseconds=1)
# A pass counts at most this many dropped cron ticks (croniter takes ~75 us a tick).
MAX_SCAN = 10_000
# On-time ticks one pass fires at most.
MAX_ON_TIME = 1000
# A cron expression croniter cannot match within this many candidates never fires.
MAX_CANDIDATES = 1000


class CatchUp(StrEnum):
    SKIP = "skip"
    LATEST = "latest"
    ALL_BOUNDED = "all-bounded"


def _micros(at: datetime) -> int:
    return (at - EPOCH) // MICRO


def _at(micros: int) -> datetime:
    return EPOCH + timedelta(microseconds=micros)


@dataclass(frozen=True, slots=True)
class Timing:
    """A schedule's ticks: `cron` in `timezone`, or `every` seconds."""

    cron: str | None
    every: int | None
    timezone: str = "UTC"

    @classmethod
    def checked(cls, *, cron: str | None, every: int | None, timezone: str) -> Timing:
        """The timing, or 422 `invalid-request` saying what is wrong with it."""
        if (cron is None) == (every is None):
            raise errors.InvalidRequestError("Give exactly one of `cron` and `every`.")
        try:
            ZoneInfo(timezone)
        except (ZoneInfoNotFoundError, ValueError):
            raise errors.InvalidRequestError(
                f"Unknown time zone {timezone!r}: use an IANA name such as Europe/Berlin."
            ) from None
        if cron is not None:
            words = cron.split()
            macro = len(words) == 1 and words[0].startswith("@")
            if not (macro or len(words) == 5) or not croniter.is_valid(cron):
                raise errors.InvalidRequestError(
                    f"cron {cron!r} is not a cron expression of five fields"
                    " (minute hour day-of-month month day-of-week) or a macro such as @daily."
                )
            cron = " ".join(words)
        if every is not None and every < 1:
            raise errors.InvalidRequestError("`every` is a whole number of seconds, at least 1.")
        return cls(cron=cron, every=every, timezone=timezone)

    @property
    def zone(self) -> ZoneInfo:
        return ZoneInfo(self.timezone)

    def ticks(self, instant: datetime) -> Iterator[datetime]:
        """The ticks strictly after `instant`, in UTC, oldest first; 422 if there are none."""
        if self.every is not None:
            step = self.every * 1_000_000
            n = _micros(instant) // step
            while True:
                n += 1
                yield _at(n * step)
        assert self.cron is not None
        zone = self.zone
        try:
            candidates = croniter(self.cron, instant.astimezone(zone))
            rejected = 0
            while rejected < MAX_CANDIDATES:
                tick: datetime = candidates.get_next(datetime)
                at = tick.astimezone(UTC)
                if at > instant and not _repeated(tick, zone):
                    rejected = 0
                    instant = at
                    yield at
                else:
                    rejected += 1
        except CroniterBadDateError:
            pass
        raise errors.InvalidRequestError(f"cron {self.cron!r} never fires.")

    def after(self, instant: datetime) -> datetime:
        """The first tick strictly after `instant`, in UTC; 422 if there is none."""
        return next(self.ticks(instant))

    def upcoming(self, start: datetime, n: int) -> list[datetime]:
        """The first `n` ticks at or after `start`."""
        return list(itertools.islice(self.ticks(start - MICRO), n))

    def count(self, start: datetime, end: datetime) -> int:
        """How many ticks fall in [start, end] (a cron schedule counts at most MAX_SCAN)."""
        if end < start:
            return 0
        if self.every is not None:
            step = self.every * 1_000_000
            first = -(-_micros(start) // step)
            last = _micros(end) // step
            return max(0, last - first + 1)
        n = 0
        for tick in self.ticks(start - MICRO):
            if tick > end or n == MAX_SCAN:
                break
            n += 1
        return n

    def newest(self, floor: datetime, end: datetime, n: int) -> list[datetime]:
        """The newest `n` ticks in [floor, end], oldest first."""
        if end < floor or n < 1:
            return []
        if self.every is not None:
            step = self.every * 1_000_000
            first = -(-_micros(floor) // step)
            last = _micros(end) // step
            k = max(0, min(n, last - first + 1))
            return [_at((last - k + 1 + i) * step) for i in range(k)]
        # Cron: look back over a window that grows until it holds `n` ticks or reaches `floor`.
        span = timedelta(hours=1)
        while True:
            start = max(floor, end - span)
            kept: deque[datetime] = deque(maxlen=n)
            for tick in self.ticks(start - MICRO):
                if tick > end:
                    break
                kept.append(tick)
            if len(kept) == n or start == floor:
                return list(kept)
            span *= 4


def _repeated(tick: datetime, zone: ZoneInfo) -> bool:
    """Whether `tick` is the second occurrence of its wall-clock time (a fall-back hour)."""
    first = tick.replace(tzinfo=zone, fold=0)
    return first.astimezone(UTC) < tick.astimezone(UTC)


@dataclass(frozen=True, slots=True)
class Plan:
    """What one pass does with a schedule: fire these ticks (oldest first), count `dropped`
    as settled without an item, and move the cursor to `next_tick` once all are fired."""

    fire: list[datetime]
    dropped: int
    next_tick: datetime


def plan(
    timing: Timing,
    *,
    cursor: datetime,
    now: datetime,
    catch_up: CatchUp,
    limit: int,
    grace: timedelta,
) -> Plan:
    """The ticks due at `now` since `cursor`, sorted by the catch-up rule."""
    if cursor > now:
        return Plan([], 0, cursor)
    on_time = timing.newest(max(cursor, now - grace), now, MAX_ON_TIME)
    if catch_up is CatchUp.SKIP:
        fire = on_time
    elif catch_up is CatchUp.LATEST:
        fire = on_time or timing.newest(cursor, now, 1)
    else:
        fire = timing.newest(cursor, now, limit)
    settled_before = fire[0] if fire else now + MICRO
    dropped = timing.count(cursor, settled_before - MICRO)
    return Plan(fire, dropped, timing.after(now))
