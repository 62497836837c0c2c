"""How BEAR's clients and servers hold their connections, so that replicas share the calls.

A client reaches a service over every address its name resolves to (a headless Service gives one per ready replica),
calls and streams of calls taken in turn (gRPC's round_robin policy; its default, pick_first, would send them all to
one replica). A server ends each connection after `MAX_CONNECTION_AGE_MS` (gRPC adds ±10%): it sends GOAWAY, the
calls in flight have `MAX_CONNECTION_AGE_GRACE_MS` to end (longer than a client's streams of calls live,
`bear.common.call_streams.STREAM_MAX_AGE_S`, with their calls' deadlines), and the client connects again, resolving the name again: replicas added
since (an autoscaler's) get their share, as they do behind a plain Service, which balances connections only.
"""

from __future__ import annotations

MAX_CONNECTION_AGE_MS = 120_000
# Longer than a stream of calls lives (30 s) plus the longest deadline a router gives a call (60 s)
MAX_CONNECTION_AGE_GRACE_MS = 120_000
CONNECTION_AGE_OPTIONS = (("grpc.max_connection_age_ms", MAX_CONNECTION_AGE_MS),
                          ("grpc.max_connection_age_grace_ms", MAX_CONNECTION_AGE_GRACE_MS))
# A service that restarts (a rollout) is found again within about a second, not after gRPC's back-off of up to 2 min.
CLIENT_CHANNEL_OPTIONS = (
    ("grpc.lb_policy_name", "round_robin"),
    ("grpc.initial_reconnect_backoff_ms", 100),
    ("grpc.min_reconnect_backoff_ms", 100),
    ("grpc.max_reconnect_backoff_ms", 1000),
)
