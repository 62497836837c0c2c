"""The dispatches this router made recently, by request id, so that ReportOutcome finds its decision without Redis
(a report that reaches another replica, or comes after a restart, is looked up in Redis instead), and so that the
latest of them go along with the next Estimate calls (`latest`); and the request ids whose outcome was reported."""

from __future__ import annotations

from collections import OrderedDict

from bear.router.decision import DispatchRecord


class RecentDispatches:
    """At most `capacity` dispatches younger than `ttl_s`; the oldest go first."""

    def __init__(self, capacity: int = 100_000, ttl_s: float = 600.0) -> None:
        self._capacity, self._ttl_s = capacity, ttl_s
        self._records: OrderedDict[str, DispatchRecord] = OrderedDict()

    def __len__(self) -> int:
        return len(self._records)

    def add(self, record: DispatchRecord) -> None:
        self._records[record.request_id] = record
        self._records.move_to_end(record.request_id)
        while len(self._records) > self._capacity:
            self._records.popitem(last=False)

    def get(self, request_id: str, now_s: float) -> DispatchRecord | None:
        self._expire(now_s)
        return self._records.get(request_id)

    def latest(self, since_s: float, limit: int) -> list[DispatchRecord]:
        """The dispatches made at `since_s` or later, at most `limit` (the newest), oldest first."""
        found: list[DispatchRecord] = []
        for record in reversed(self._records.values()):
            if record.dispatched_at_s < since_s or len(found) >= limit:
                break
            found.append(record)
        found.reverse()
        return found

    def _expire(self, now_s: float) -> None:
        records = self._records
        while records:
            oldest = next(iter(records.values()))
            if oldest.dispatched_at_s >= now_s - self._ttl_s:
                return
            records.popitem(last=False)


class ReportedIds:
    """The request ids whose outcome was reported here, the latest `capacity` of them: a report repeated (a client's
    retry) is answered, but counted once."""

    def __init__(self, capacity: int = 100_000) -> None:
        self._capacity = capacity
        self._ids: OrderedDict[str, None] = OrderedDict()

    def first(self, request_id: str) -> bool:
        """Whether this is the first report of `request_id` (it is one no longer afterwards)."""
        if request_id in self._ids:
            return False
        self._ids[request_id] = None
        if len(self._ids) > self._capacity:
            self._ids.popitem(last=False)
        return True
