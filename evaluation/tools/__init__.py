"""Maintenance scripts of the evaluation package (table extraction, sanity figures); run with `python -m`."""
