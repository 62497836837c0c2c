"""A service's background tasks (bear.common.service): one that ends while the service runs is logged, since its work
(a snapshot feed, a registration refresh) has stopped; what they raise while unwinding at shutdown is not."""

from __future__ import annotations

import asyncio
import logging

import pytest

from bear.common.service import _report_early_end


def _ended(stop_first: bool, caplog: pytest.LogCaptureFixture, body: str) -> list[str]:
    async def work() -> None:
        await asyncio.sleep(0)
        if body == "raises":
            raise ConnectionError("Connection closed by the server")

    async def main() -> None:
        stop = asyncio.Event()
        if stop_first:
            stop.set()
        task = asyncio.create_task(work(), name="feed")
        task.add_done_callback(_report_early_end(stop))
        await asyncio.wait([task])
        await asyncio.sleep(0)  # the done-callbacks run

    with caplog.at_level(logging.ERROR, logger="bear.service"):
        asyncio.run(main())
    return [record.getMessage() for record in caplog.records]


def test_a_task_that_fails_while_the_service_runs_is_logged(caplog: pytest.LogCaptureFixture) -> None:
    assert _ended(False, caplog, "raises") == ["background task feed ended with an error; its work has stopped"]


def test_a_task_that_returns_while_the_service_runs_is_logged(caplog: pytest.LogCaptureFixture) -> None:
    assert _ended(False, caplog, "returns") == ["background task feed ended; its work has stopped"]


def test_what_a_task_raises_at_shutdown_is_dropped(caplog: pytest.LogCaptureFixture) -> None:
    assert _ended(True, caplog, "raises") == []
