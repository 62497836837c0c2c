"""Evaluation without GPUs: the reference H100 step-time model of the simulated pool (DESIGN.md §5)."""
