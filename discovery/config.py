"""Discovery settings, read once at start-up by the router and the estimator (their config embeds this one).

    BEAR_DISCOVERY                 static (default: the pools file's instances) or kubernetes (the pools' pods)
    BEAR_NAMESPACE                 namespace of the pods (kubernetes; default: this pod's, else "default")
    BEAR_POOLS_FILE                the pools file (bear.discovery.pools); empty: no pools
    BEAR_DISCOVERY_WATCH_TIMEOUT_S how long one watch request lasts before it is renewed (default 300, 1 to 86400)
    BEAR_DISCOVERY_BACKOFF_CAP_S   longest wait between retries after an API error (default 10, 0.2 to 3600)
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

MODES = ("static", "kubernetes")
# Where Kubernetes mounts the service account's namespace in every pod that has one.
SERVICE_ACCOUNT_NAMESPACE_FILE = Path("/var/run/secrets/kubernetes.io/serviceaccount/namespace")


ENVIRONMENT = ("BEAR_DISCOVERY", "BEAR_NAMESPACE", "BEAR_POOLS_FILE", "BEAR_DISCOVERY_WATCH_TIMEOUT_S",
               "BEAR_DISCOVERY_BACKOFF_CAP_S")
_NAMESPACE = re.compile(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?")  # an RFC 1123 label, as Kubernetes names namespaces
MAX_WATCH_TIMEOUT_S = 86400.0  # a day (watches are normally renewed every few minutes)
MAX_BACKOFF_CAP_S = 3600.0  # an hour (a longer wait would leave a pool that lost the API server stale for hours)


@dataclass(frozen=True, slots=True)
class DiscoveryConfig:
    mode: str = "static"
    namespace: str = "default"
    pools_file: str = ""
    watch_timeout_s: float = 300.0
    backoff_base_s: float = 0.2
    backoff_cap_s: float = 10.0

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise ValueError(f"BEAR_DISCOVERY must be one of {', '.join(MODES)}, got {self.mode!r}")
        if not self.namespace:
            raise ValueError("BEAR_NAMESPACE must not be empty")
        if self.mode == "kubernetes" and not _NAMESPACE.fullmatch(self.namespace):  # else no pod is ever listed
            raise ValueError(f"BEAR_NAMESPACE must be a Kubernetes namespace name (at most 63 lower-case letters, "
                             f"digits and '-', starting and ending with a letter or digit), got {self.namespace!r}")
        if not 1 <= self.watch_timeout_s <= MAX_WATCH_TIMEOUT_S:  # also refuses nan and inf
            raise ValueError(f"BEAR_DISCOVERY_WATCH_TIMEOUT_S must be >= 1 and <= {MAX_WATCH_TIMEOUT_S:g} (a day), "
                             f"got {self.watch_timeout_s}")
        if not 0 < self.backoff_base_s <= self.backoff_cap_s <= MAX_BACKOFF_CAP_S:
            raise ValueError(f"BEAR_DISCOVERY_BACKOFF_CAP_S must be >= {self.backoff_base_s} and <= "
                             f"{MAX_BACKOFF_CAP_S:g} (an hour), got {self.backoff_cap_s}")

    @staticmethod
    def from_environ(environ: Mapping[str, str],
                     namespace_file: Path = SERVICE_ACCOUNT_NAMESPACE_FILE) -> DiscoveryConfig:
        defaults = DiscoveryConfig()
        return DiscoveryConfig(
            mode=(environ.get("BEAR_DISCOVERY") or defaults.mode).strip().lower(),
            namespace=(environ.get("BEAR_NAMESPACE") or "").strip() or _own_namespace(namespace_file)
            or defaults.namespace,
            pools_file=environ.get("BEAR_POOLS_FILE", ""),
            watch_timeout_s=_float(environ, "BEAR_DISCOVERY_WATCH_TIMEOUT_S", defaults.watch_timeout_s),
            backoff_cap_s=_float(environ, "BEAR_DISCOVERY_BACKOFF_CAP_S", defaults.backoff_cap_s),
        )


def _own_namespace(namespace_file: Path) -> str:
    try:
        return namespace_file.read_text().strip()
    except OSError:
        return ""


def _float(environ: Mapping[str, str], name: str, default: float) -> float:
    text = environ.get(name, "").strip()
    try:
        return float(text) if text else default
    except ValueError:
        raise ValueError(f"{name} must be a number, got {text!r}") from None
