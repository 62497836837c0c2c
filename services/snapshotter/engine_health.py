"""Whether the vLLM server answers on HTTP: the sidecar's second sign of a live engine, beside the region's heartbeat.

The plugin creates the region when vLLM builds its scheduler, a fraction of a second to many seconds before the API
server listens, and an engine killed with its API server stops beating only `engine_timeout_s` later. A sidecar given
the server's health URL (vLLM's `/health`: 200 while the engine runs, 503 once it died) registers the instance only
once the URL answers 200, and withdraws it after `failures_to_fail` failed probes in a row (refused, timed out, any
other status), so that routers neither send queries to a server that refuses them nor keep sending to a dead one.
"""

from __future__ import annotations

import logging
import threading
import urllib.error
import urllib.request

logger = logging.getLogger("bear.snapshotter")

PROBE_INTERVAL_S = 0.5
PROBE_TIMEOUT_S = 1.0
FAILURES_TO_FAIL = 2  # one lost probe on a loaded server is no death


class EngineHealthProbe:
    """Probes `url` every `interval_s` in a thread of its own (`start`/`stop`); `healthy()` is read by any thread.
    Not healthy until the first answer of 200."""

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
        # Straight to the server: an HTTP(S)_PROXY in the pod's environment must not carry the probe of its own vLLM
        # elsewhere (urllib would, for localhost too, unless NO_PROXY names it).
        self._opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))

    def healthy(self) -> bool:
        return self._healthy

    def probe_once(self) -> bool:
        """One probe; updates and returns `healthy()`."""
        self.num_probes += 1
        failure = self._probe()
        if failure is None:
            if not self._healthy:
                logger.info("the vLLM server answers %s", self.url)
            self._healthy, self._failures = True, 0
            return True
        self.num_failures += 1
        self._failures += 1
        if self._healthy and self._failures >= self._failures_to_fail:
            logger.warning("the vLLM server failed %d health probes in a row (%s): %s", self._failures, self.url,
                           failure)
            self._healthy = False
        elif not self._healthy and failure != self._last_failure:
            logger.info("waiting for the vLLM server to answer %s: %s", self.url, failure)
        self._last_failure = failure
        return self._healthy

    def _probe(self) -> str | None:
        """None if the URL answered 200; what went wrong otherwise."""
        try:
            with self._opener.open(self.url, timeout=self._timeout_s) as response:
                status = response.status
        except urllib.error.HTTPError as error:
            return f"HTTP {error.code}"
        except (OSError, ValueError) as error:  # refused, unreachable, timed out (URLError and TimeoutError are OSError)
            reason = getattr(error, "reason", None) or error
            return f"{type(reason).__name__}: {reason}" if not isinstance(reason, str) else reason
        return None if status == 200 else f"HTTP {status}"

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="engine-health", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            self.probe_once()
            self._stop.wait(self._interval_s)

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(self._timeout_s + 1)
