"""Routing policies: one contract (`Policy.choose`), a registry by kebab-case name, BEAR's policies and the baselines.

Pure domain code, shared as is by the router service, the evaluation harness and the Helm chart's settings.
"""
