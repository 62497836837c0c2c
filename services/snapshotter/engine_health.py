"""Whether the vLLM server answers on HTTP: the sidecar's second sign of a live engine, beside the region's heartbeat.

The plugin creates the region when vLLM builds its scheduler, a fraction of a second to many seconds before the API
server listens, and an engine killed with its API server stops beating only `engine_timeout_s` later. A sidecar given
the server's health URL (vLLM's `/health`: 200 while the engine runs, 503 once it died) registers the instance only
once the URL answers 200, and withdraws it after `failures_to_fail` failed probes in a row: refused, not answered in
full within `timeout_s`, any other status (a redirect too: the server in the pod answers itself), or anything else
going wrong — so that routers neither send queries to a server that refuses them nor keep sending to a dead one. A
probe runs in a thread of its own and counts as failed once `timeout_s` has passed, whatever the server still sends.
"""

from __future__ import annotations

import logging
import threading
import time
import urllib.error
import urllib.request

logger = logging.getLogger("bear.snapshotter")

PROBE_INTERVAL_S = 0.5
PROBE_TIMEOUT_S = 3.0  # vLLM answers /health at once; a loaded server's event loop can take a while
FAILURES_TO_FAIL = 2  # one lost probe is no death


class _NoRedirects(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, *args: object, **kwargs: object) -> None:
        return None  # the 3xx answer is the probe's result


class EngineHealthProbe:
    """Probes `url` every `interval_s` (`start`/`stop`); `healthy()` is read by any thread. Not healthy until the
    first answer of 200."""

    def __init__(self, url: str, interval_s: float = PROBE_INTERVAL_S, timeout_s: float = PROBE_TIMEOUT_S,
                 failures_to_fail: int = FAILURES_TO_FAIL):
        if not (interval_s > 0 and timeout_s > 0 and failures_to_fail >= 1):
            raise ValueError("interval_s and timeout_s must be > 0, failures_to_fail >= 1")
        self.url = url
        self._interval_s = interval_s
        self._timeout_s = timeout_s
        self._failures_to_fail = failures_to_fail
        self._healthy = False
        self._failures = 0
        self._last_failure = ""
        self.num_probes = 0
        self.num_failures = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._in_flight: _Probe | None = None
        # Straight to the server: an HTTP(S)_PROXY in the pod's environment must not carry the probe of its own vLLM
        # elsewhere (urllib would, for localhost too, unless NO_PROXY names it).
        self._opener = urllib.request.build_opener(urllib.request.ProxyHandler({}), _NoRedirects())

    def healthy(self) -> bool:
        return self._healthy

    @property
    def last_failure(self) -> str:
        """What went wrong with the latest failed probe ("" before any)."""
        return self._last_failure

    def probe_once(self) -> bool:
        """One probe (or, while an earlier one still hangs, another wait for it); updates and returns `healthy()`."""
        self.num_probes += 1
        if self._in_flight is None:
            self._in_flight = _Probe(self._opener, self.url, self._timeout_s)
        probe = self._in_flight
        deadline = time.monotonic() + self._timeout_s
        while not probe.done.is_set() and not self._stop.is_set() and (left := deadline - time.monotonic()) > 0:
            probe.done.wait(min(left, 0.05))
        if probe.done.is_set():
            self._in_flight = None
            failure = probe.failure
        else:
            failure = f"no answer within {self._timeout_s:g} s"
        if failure is None:
            if not self._healthy:
                logger.info("the vLLM server answers %s", self.url)
            self._healthy, self._failures = True, 0
            return True
        self.num_failures += 1
        self._failures += 1
        if self._healthy and self._failures >= self._failures_to_fail:
            logger.warning("the vLLM server failed %d health probes in a row at %s: %s", self._failures, self.url,
                           failure)
            self._healthy = False
        elif not self._healthy and (failure != self._last_failure or self._failures % 60 == 0):
            logger.info("waiting for the vLLM server to answer %s (%d probes): %s", self.url, self._failures, failure)
        self._last_failure = failure
        return self._healthy

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="engine-health", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self.probe_once()
            except Exception:  # noqa: BLE001 - the probe thread must outlive anything: log, count it as failed
                logger.exception("engine health probe of %s failed", self.url)
                self._healthy = False
            self._stop.wait(self._interval_s)

    def stop(self) -> None:
        """Returns at once (a hanging request's thread is left to end on its own)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(1.0)


class _Probe:
    """One GET in a daemon thread of its own: `done` once it ended; `failure` None if it answered 200."""

    def __init__(self, opener: urllib.request.OpenerDirector, url: str, timeout_s: float):
        self.failure: str | None = "not finished"
        self.done = threading.Event()
        threading.Thread(target=self._get, args=(opener, url, timeout_s), name="engine-health-get",
                         daemon=True).start()

    def _get(self, opener: urllib.request.OpenerDirector, url: str, timeout_s: float) -> None:
        try:
            with opener.open(url, timeout=timeout_s) as response:
                self.failure = None if response.status == 200 else f"HTTP {response.status}"
        except urllib.error.HTTPError as error:
            self.failure = f"HTTP {error.code}"
        except urllib.error.URLError as error:  # refused, unreachable, TLS refused
            self.failure = f"{error.reason}"
        except Exception as error:  # noqa: BLE001 - timeouts, a peer that does not speak HTTP, a bad URL: all failures
            self.failure = f"{type(error).__name__}: {error}"
        finally:
            self.done.set()
