"""What BEAR keeps in Redis, by name. Values are serialised bear.v1 messages (protobuf binary); everything can be lost
and is rebuilt within one snapshot interval.

    bear:instances                 sorted set: instance id → time of its last refresh (Unix seconds); an entry
                                   not refreshed for INSTANCES_WINDOW_S is stale: readers skip it, routers remove it
    bear:instance:<id>             InstanceRegistration, with a TTL refreshed while the instance lives
    bear:snapshot:<id>             InstanceSnapshot, the latest one, with the same TTL
    bear:coefficients:<id>         BatchTimeCoefficients, the latest fit, with the same TTL
    channel bear:snapshots         every published InstanceSnapshot (it carries the instance id and the coefficients);
                                   `bear:snapshots:db<N>` for database N > 0: Redis' channels span its databases, so
                                   the name keeps the pools of two databases apart (`snapshots_channel`)
    bear:dispatch:<request id>     DispatchRecord of a routed query (router → estimator), with a TTL (DISPATCH_TTL_S)
    bear:dispatches:<id>           sorted set: request ids routed to the instance → dispatch time (Unix seconds);
                                   entries older than DISPATCH_TTL_S are trimmed by the writer
    bear:demo                      a random token, with a short TTL refreshed while a `bear demo` runs on this database
                                   (--redis-url): the claim that keeps a second one off it
    bear:present                   Redis' epoch, no TTL, set by the first router to find it missing: when it
                                   changes, Redis is new or came back empty (its instances register again within
                                   their heartbeat, the routers write their latest dispatch records again)
"""

from __future__ import annotations

INSTANCES = "bear:instances"
INSTANCES_WINDOW_S = 600.0  # an instance whose entry in INSTANCES is older is gone (a pod long replaced)
PRESENT = "bear:present"
DEMO = "bear:demo"
DISPATCH_TTL_S = 600.0  # a dispatch record outlives any request BEAR estimates for
SNAPSHOTS_CHANNEL = "bear:snapshots"


def snapshots_channel(database: int) -> str:
    """The snapshots channel of the pool whose keys are in `database` (0: bear:snapshots)."""
    return SNAPSHOTS_CHANNEL if database == 0 else f"{SNAPSHOTS_CHANNEL}:db{database}"


def database_of(client: object) -> int:
    """The database number a redis-py client (blocking or asyncio) was opened on."""
    return int(client.connection_pool.connection_kwargs.get("db") or 0)  # type: ignore[attr-defined]


def instance_key(instance_id: str) -> str:
    return f"bear:instance:{instance_id}"


def snapshot_key(instance_id: str) -> str:
    return f"bear:snapshot:{instance_id}"


def coefficients_key(instance_id: str) -> str:
    return f"bear:coefficients:{instance_id}"


def dispatch_key(request_id: str) -> str:
    return f"bear:dispatch:{request_id}"


def dispatches_key(instance_id: str) -> str:
    return f"bear:dispatches:{instance_id}"
