"""The `bear` command line."""
