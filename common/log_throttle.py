"""When to log about a key that keeps coming back bad (a value in Redis that does not decode, a snapshot refused):
the first time, then every `every`th time, so that what is read again and again does not flood the log."""

from __future__ import annotations


class LogThrottle:
    """Counts bad occurrences by key; `should_log` is true the first time a key is bad, then every `every`th time.
    Keys are forgotten when `ok` is called for them, and all at once past `max_keys` (a flood of distinct keys)."""

    def __init__(self, every: int = 100, max_keys: int = 4096) -> None:
        self._every = every
        self._max_keys = max_keys
        self._counts: dict[str, int] = {}

    def should_log(self, key: str) -> bool:
        if key not in self._counts and len(self._counts) >= self._max_keys:
            self._counts.clear()
        count = self._counts.get(key, 0) + 1
        self._counts[key] = count
        return count == 1 or count % self._every == 0

    def count(self, key: str) -> int:
        return self._counts.get(key, 0)

    def ok(self, key: str) -> None:
        self._counts.pop(key, None)
