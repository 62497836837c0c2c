"""`bear demo`: BEAR on a laptop: embedded Redis, the services, a simulated pool in real time, a workload."""
