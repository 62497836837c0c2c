"""`bear.demo.pool.PoolProcess`: a pool's process that ends before it is ready is reported at once, with its exit
status, not after the start's time-out."""

from __future__ import annotations

import sys
import time

import pytest

from bear.common.redis_config import RedisConfig
from bear.demo.pool import READY_TIMEOUT_S, PoolConfig, PoolProcess


def test_a_pool_process_that_ends_before_it_is_ready_fails_the_start_at_once(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sys, "executable", "/bin/false")  # a process that ends at once, status 1
    pool = PoolProcess(PoolConfig((), RedisConfig(url="redis://127.0.0.1:1/0"), {}), lambda event: None)
    started = time.monotonic()
    with pytest.raises(RuntimeError, match=r"the simulated pool did not start: its process ended \(exit status 1\)"):
        pool.start()
    assert time.monotonic() - started < READY_TIMEOUT_S / 4
    assert pool.exit_code == 1
