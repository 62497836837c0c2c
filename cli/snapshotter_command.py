"""`bear snapshotter`: run the snapshotter sidecar of one vLLM instance (the same as `bear serve snapshotter`)."""

from __future__ import annotations

import argparse

from bear.snapshotter import serve


def add_parser(commands: argparse._SubParsersAction) -> None:
    parser = commands.add_parser(
        "snapshotter",
        help="run the snapshotter sidecar of a vLLM instance",
        description="Reads the snapshot region the vLLM scheduler plugin writes, publishes the latest snapshot and the "
        "fitted batch-time coefficients to Redis and serves them over gRPC (bear.v1.Snapshotter). Prints the gRPC "
        "port on its first line of output once listening. Settings: bear.snapshotter.config (flags override them).",
    )
    serve.add_arguments(parser)
    parser.set_defaults(handler=serve.run)
