"""Which model instances exist and which are ready: the set the router and the estimator route over.

Two sources, one interface (`bear.discovery.instances.Discovery`):

- `static` (the local default): the instances listed in the pools file, always considered ready.
- `kubernetes`: each pool's pods, found by the pool's label selector and followed with list + watch; a pod is an
  instance while it is Running, Ready, not terminating and has an IP (`bear.discovery.pods`).

`bear.discovery.factory.open_discovery(config, pools)` builds the configured one. The package never imports gRPC; the
Kubernetes client is imported only by the `kubernetes` source. See README.md beside this file.
"""
