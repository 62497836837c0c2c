"""The estimator: TTFT estimates of a query on every instance, from the instances' latest snapshots."""
