"""Which instances a query may go to: the ready instances, from discovery and from the registrations in Redis.

- With pools (a pools file), discovery decides: its ready instances (static: all listed; Kubernetes: pods that are
  Running, Ready and not terminating) are the candidates. A registration adds what discovery lacks (endpoint,
  prices), the pools file's prices come first.
- Without pools, every instance registered in Redis (its snapshotter refreshes the registration with a TTL while the
  instance lives) is a candidate.

A registration missing from Redis is dropped at once — its sidecar withdrew it (no live engine) or stopped refreshing
it (the sidecar is gone) — except for `forget_after_s` after Redis was found new or back empty: its snapshotters
register again within their heartbeat, and routing must not stop meanwhile.

Model names match exactly, or by their last path segment where one of them has no organisation ("Qwen/Qwen3-8B" is
"Qwen3-8B"), so that a Hugging Face name in the pools and the predictor catalogue's short name meet; two names of
different organisations ("Qwen/Qwen3-8B", "unsloth/Qwen3-8B") are different models.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass

from bear.common.messages import shown
from bear.discovery.instances import Instance
from bear.discovery.pools import PoolSpec
from bear.router.query import InvalidQuery


@dataclass(frozen=True, slots=True)
class Registration:
    """What an instance's snapshotter registered in Redis (bear.v1.InstanceRegistration)."""

    instance_id: str
    pool: str
    model: str
    endpoint: str
    input_usd_per_mtok: float = 0.0
    output_usd_per_mtok: float = 0.0


@dataclass(frozen=True, slots=True)
class InstanceInfo:
    """A routable instance."""

    instance_id: str
    pool: str
    model: str
    endpoint: str
    input_usd_per_mtok: float = 0.0
    output_usd_per_mtok: float = 0.0

    @property
    def has_prices(self) -> bool:
        return self.input_usd_per_mtok > 0 or self.output_usd_per_mtok > 0

    def cost_micro_usd(self, prompt_tokens: float, output_tokens: float) -> float:
        """Tokens × USD per million tokens (the unit of eq. 4)."""
        return prompt_tokens * self.input_usd_per_mtok + output_tokens * self.output_usd_per_mtok


def short_model_name(model: str) -> str:
    return model.rsplit("/", 1)[-1]


def same_model(a: str, b: str) -> bool:
    return a == b or (("/" not in a or "/" not in b) and short_model_name(a) == short_model_name(b))


def routable_instances(discovered: Mapping[str, Instance], pools: Sequence[PoolSpec],
                       registrations: Mapping[str, Registration]) -> tuple[InstanceInfo, ...]:
    """The candidates, ordered by instance id."""
    if not pools:
        return tuple(InstanceInfo(r.instance_id, r.pool, r.model, r.endpoint, r.input_usd_per_mtok,
                                  r.output_usd_per_mtok) for _, r in sorted(registrations.items()))
    by_pool = {pool.name: pool for pool in pools}
    out = []
    for instance_id, instance in sorted(discovered.items()):
        registration = registrations.get(instance_id)
        pool = by_pool.get(instance.pool)
        prices = (pool.input_usd_per_mtok, pool.output_usd_per_mtok) if pool is not None else (0.0, 0.0)
        if prices == (0.0, 0.0) and registration is not None:
            prices = (registration.input_usd_per_mtok, registration.output_usd_per_mtok)
        endpoint = instance.endpoint or (registration.endpoint if registration is not None else "")
        out.append(InstanceInfo(instance_id, instance.pool, instance.model, endpoint, *prices))
    return tuple(out)


class InstancePool:
    """The routable instances now. Discovery's set is read on every call (an immutable mapping, swapped whole on
    change); registrations are replaced by the router's refresh loop."""

    def __init__(self, discovered: Callable[[], Mapping[str, Instance]], pools: Sequence[PoolSpec] = (),
                 forget_after_s: float = 15.0) -> None:
        self._discovered = discovered
        self._pools = tuple(pools)
        self._forget_after_s = forget_after_s
        self._registrations: dict[str, Registration] = {}
        # Redis came back empty: the instances held then are kept until their sidecars register them again
        self._held_at_reset: frozenset[str] = frozenset()
        self._keep_missing_until_s = -float("inf")
        self._seen: Mapping[str, Instance] | None = None
        self._instances: tuple[InstanceInfo, ...] = ()
        self._models_seen: set[str] = {p.model for p in self._pools}  # every model ever registered or discovered

    def update_registrations(self, found: Mapping[str, Registration], now_s: float, redis_new: bool = False) -> None:
        """The registrations just read from Redis. Those not found are gone, unless Redis is new or came back empty
        (`redis_new`): then those held at that moment are kept for `forget_after_s`, until their sidecars register
        them again."""
        if redis_new:
            self._held_at_reset = frozenset(self._registrations)
            self._keep_missing_until_s = now_s + self._forget_after_s
        kept = {}
        if now_s <= self._keep_missing_until_s:
            kept = {i: r for i, r in self._registrations.items() if i not in found and i in self._held_at_reset}
        registrations = {**kept, **found}
        if registrations != self._registrations:
            self._registrations = registrations
            self._seen = None

    def instances(self) -> tuple[InstanceInfo, ...]:
        discovered = self._discovered()
        if discovered is not self._seen:
            self._instances = routable_instances(discovered, self._pools, self._registrations)
            self._seen = discovered
        return self._instances

    def known_models(self) -> set[str]:
        """Every model the router has heard of since it started: the pools', those registered or discovered (a model
        whose last instance went away stays known, so a query for it waits for capacity, UNAVAILABLE, rather than
        being told its model does not exist)."""
        self._models_seen |= {r.model for r in self._registrations.values()} | {i.model for i in self.instances()}
        return set(self._models_seen)

    def select(self, allowed_models: Iterable[str]) -> tuple[InstanceInfo, ...]:
        """The ready instances serving one of `allowed_models` (all if empty). An allowed model the router has never
        heard of, while it knows some, is an InvalidQuery; a known model with no ready instance, or any model before
        the router has heard of one (a pool still starting), just selects nothing."""
        allowed = tuple(allowed_models)
        instances = self.instances()
        if not allowed:
            return instances
        known = self.known_models()
        if not known:
            return ()
        for model in allowed:
            if not any(same_model(model, k) for k in known):
                raise InvalidQuery("allowed_models", f"unknown model {shown(model)}; the pool serves: "
                                                     f"{', '.join(sorted(known)) or 'nothing yet'}")
        return tuple(i for i in instances if any(same_model(i.model, m) for m in allowed))
