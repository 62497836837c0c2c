"""`bear serve <service>`: run one of BEAR's services (router, estimator, predictor, snapshotter).

Each service's `main` module defines `add_arguments(parser)` and `run(args) -> int`; settings come from flags, then
the environment, then (router, estimator, predictor) an optional `--config` YAML file: flags override the environment,
which overrides the file. The snapshotter, a sidecar configured by its pod's environment, takes flags and environment.
Imports happen only for the service that runs.
"""

from __future__ import annotations

import argparse
import importlib

SERVICES = {
    "router": "bear.router.main",
    "estimator": "bear.estimator.main",
    "predictor": "bear.predictor.main",
    "snapshotter": "bear.snapshotter.serve",
}


def add_parser(commands: argparse._SubParsersAction) -> None:
    parser = commands.add_parser("serve", help="run a BEAR service", description=__doc__.split("\n\n")[0])
    services = parser.add_subparsers(dest="service", required=True, metavar="SERVICE")
    for name, module in SERVICES.items():
        sub = services.add_parser(name, help=f"run the {name} service")
        sub.set_defaults(handler=_handler(module), service_module=module)
        _add_service_arguments(sub, module)


def _add_service_arguments(parser: argparse.ArgumentParser, module: str) -> None:
    try:
        importlib.import_module(module).add_arguments(parser)
    except ModuleNotFoundError as error:
        if not module.startswith(error.name or "-"):
            raise
        parser.set_defaults(unavailable=f"the service module {module} is not installed")


def _handler(module: str):  # noqa: ANN202 - argparse handler
    def run(args: argparse.Namespace) -> int:
        unavailable = getattr(args, "unavailable", None)
        if unavailable:
            raise SystemExit(f"bear serve: {unavailable}")
        return int(importlib.import_module(module).run(args) or 0)

    return run
