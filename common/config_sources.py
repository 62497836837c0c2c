"""Where a service's settings come from: command-line flags over the environment over an optional YAML file.

Every setting has one name, its environment variable (e.g. BEAR_MAX_SNAPSHOT_AGE_S). In the file it is written
without the `BEAR_` prefix, in lower case; values are scalars, read as the text written (`0123` is 0123, `yes` is yes,
as in the environment; YAML 1.1 would read octal, booleans, sexagesimal numbers):

    max_snapshot_age_s: 1.0
    redis_url: redis://redis:6379/0
    estimator_metrics_port: off

`layered_environ` merges the three sources into one mapping of environment strings, which the service's config then
parses once (its `from_environ`, through `load_layered`), so that a value means the same wherever it was given; an
error names the setting's variable and, where a flag or the file gave it, that flag or key. An empty (or blank)
environment variable counts as unset: the file's value, else the default, applies. A key the file should not have (a
typo, another service's setting) is an error that names it; an environment variable that nearly names a setting (a
typo: BEAR_REDIS_ULR) is warned about, as pods share their environment with other programs. Standard library and
PyYAML only.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import math
import re
from collections.abc import Callable, Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any, TypeVar

PREFIX = "BEAR_"
T = TypeVar("T")
logger = logging.getLogger("bear.config")


class ConfigFileError(ValueError):
    """A config file that cannot be used; the message names the file and the key."""


def add_flags(parser: argparse.ArgumentParser, flags: Mapping[str, tuple[str, str]]) -> None:
    """`--config FILE` and one option per flag (flag → (environment variable, help)), stored under the variable's
    name (see `flag_values`)."""
    example = next(iter(flags.values()))[0].removeprefix(PREFIX).lower()  # a key this service reads
    parser.add_argument("--config", metavar="FILE", type=given_value,
                        help="YAML file of settings, each written as its environment variable without BEAR_, in lower "
                        f"case (e.g. {example}: VALUE); the environment and flags override it")
    for flag, (name, text) in flags.items():
        parser.add_argument(flag, dest=name, metavar=flag.removeprefix("--").replace("-", "_").upper(),
                            type=given_value, help=f"{text}; {name}")


def given_value(text: str) -> str:
    """A flag's value must say something: `--grpc-port ""` (an unset shell variable) would otherwise override the
    environment and the file with nothing, and the default would apply unseen."""
    if not text.strip():
        raise argparse.ArgumentTypeError("empty value (leave the flag out to use its setting's value from elsewhere, "
                                          "or its default)")
    return text


def flag_values(args: argparse.Namespace, flags: Mapping[str, tuple[str, str]]) -> dict[str, object]:
    """Environment variable → the value its flag was given (None: not given), for `layered_environ`."""
    return {name: getattr(args, name, None) for name, _ in flags.values()}


def layered_environ(environ: Mapping[str, str], config_file: str | Path | None, flags: Mapping[str, object],
                    known: Iterable[str]) -> dict[str, str]:
    """The file's settings, overridden by the environment's (an empty or blank variable: unset), overridden by the
    flags given (None: not given); `flags` and the file are keyed by environment variable and by file key
    respectively, both among `known`."""
    return _layers(environ, config_file, flags, known)[0]


def load_layered(parse: Callable[[Mapping[str, str]], T], environ: Mapping[str, str], config_file: str | Path | None,
                 flags: Mapping[str, object], known: Iterable[str], flag_table: Mapping[str, tuple[Any, ...]]) -> T:
    """`parse(layered_environ(...))`, where a ValueError's message, which names settings by their environment
    variables, also says where those given by a flag or in the file were given (`flag_table`: flag → (variable,
    ...))."""
    flag_of = {entry[0]: flag for flag, entry in flag_table.items()}
    known = set(known)
    for name, meant in misspelled(environ, known):
        logger.warning("%s is not a setting of this service: ignored (did you mean %s?)", name, meant)
    merged, sources = _layers(environ, config_file, flags, known, flag_of)
    with given_as(sources):
        return parse(merged)


# How alike (difflib's ratio) an unknown BEAR_* variable must be to a known one to be taken for its typo: every
# BEAR_* name of one service is below 0.86 to every other service's (pods share environments), typos (GRCP for GRPC,
# a letter left out) are above 0.9.
TYPO_LIKENESS = 0.88


def misspelled(environ: Mapping[str, str], known: Iterable[str]) -> list[tuple[str, str]]:
    """(variable, the known one it likely misspells) for each BEAR_* variable set in `environ` that is not `known`
    but nearly one: otherwise silently ignored, the default applying instead of the value meant."""
    import difflib

    known = set(known)
    found = []
    for name in sorted(environ):
        if name.startswith(PREFIX) and name not in known:
            close = difflib.get_close_matches(name, known, n=1, cutoff=TYPO_LIKENESS)
            if close:
                found.append((name, close[0]))
    return found


@contextlib.contextmanager
def given_as(sources: Mapping[str, str]) -> Iterator[None]:
    """Adds to a ValueError raised inside (a plain one: a subclass keeps its own message) where the settings its
    message names were given, for those of `sources` (environment variable → e.g. "--grpc-port"): a user who typed
    a flag finds it named, not only its variable."""
    try:
        yield
    except ValueError as error:
        if type(error) is not ValueError:
            raise
        message = str(error)
        named = [(name, source) for name, source in sources.items()
                 if re.search(rf"\b{name}\b", message) and source not in message]  # not said already
        if not named:
            raise
        if len(named) == 1:
            where = f"given as {named[0][1]}"
        else:
            where = "; ".join(f"{name} given as {source}" for name, source in named)
        raise ValueError(f"{error} ({where})") from None


def _layers(environ: Mapping[str, str], config_file: str | Path | None, flags: Mapping[str, object],
            known: Iterable[str], flag_of: Mapping[str, str] | None = None) -> tuple[dict[str, str], dict[str, str]]:
    """The merged settings, and where those not from the environment came from (the flag, by `flag_of`: variable →
    flag; or the file's key)."""
    known = set(known)
    merged = dict(read_config_file(Path(config_file), known)) if config_file else {}
    sources = {name: f"{name.removeprefix(PREFIX).lower()} in config file {config_file}" for name in merged}
    for name, value in environ.items():
        if value.strip():
            merged[name] = value
            sources.pop(name, None)
    for name, value in flags.items():
        if value is not None:
            merged[name] = _text(value)
            sources[name] = (flag_of or {}).get(name, "a flag")
    return merged, sources


def read_config_file(path: Path, known: set[str]) -> dict[str, str]:
    """The file's settings by environment variable name."""
    import yaml

    from bear.common.yaml_files import load_yaml, read_settings_file

    text = ""
    try:
        text = read_settings_file(path)
        document = load_yaml(text, scalars_as_text=True) or {}
    except UnicodeDecodeError as error:
        raise ConfigFileError(f"config file {path}: not UTF-8 text (byte {error.object[error.start]:#04x} at "
                              f"offset {error.start})") from None
    except OSError as error:
        raise ConfigFileError(f"config file {path}: {error.strerror or error}") from None
    except yaml.YAMLError as error:
        raise ConfigFileError(f"config file {path}: {error}{_bracket_hint(text, error)}") from None
    if not isinstance(document, Mapping):
        raise ConfigFileError(f"config file {path}: expected a mapping of settings, got {type(document).__name__}")
    settings = {}
    names = ", ".join(sorted(n.removeprefix(PREFIX).lower() for n in known))
    for key, value in document.items():
        if key is None:  # `null:` or `~:`, YAML's null
            raise ConfigFileError(f"config file {path}: a key is null, which names no setting (known: {names})")
        name = PREFIX + str(key).upper()
        if str(key) != str(key).lower():  # `PORT` beside `port` would pass the duplicate-key check
            raise ConfigFileError(f"config file {path}: {key!r}: settings are written in lower case "
                                  f"({str(key).lower()!r})")
        if name not in known:
            raise ConfigFileError(f"config file {path}: unknown setting {key!r} (known: {names})")
        if isinstance(value, (Mapping, list)):
            hint = f" ({_QUOTE_BRACKETS % key})" if isinstance(value, list) else ""
            raise ConfigFileError(f"config file {path}: {key} must be a single value{hint}")
        if value is not None:
            settings[name] = _text(value)
    return settings


# An IPv6 host is written in brackets, which YAML reads as a list (or fails on, for `[::1]`)
_QUOTE_BRACKETS = "quote a value that starts with '[', e.g. %s: '[::1]'"


def _bracket_hint(text: str, error: Exception) -> str:
    """For a YAML error on a line of `text` whose value starts with '[': how to write it."""
    mark = getattr(error, "problem_mark", None)
    lines = text.splitlines()
    if mark is None or not 0 <= mark.line < len(lines):
        return ""
    written = re.match(r"\s*([A-Za-z0-9_]+)\s*:\s*\[", lines[mark.line])
    return f" ({_QUOTE_BRACKETS % written.group(1)})" if written else ""


def _text(value: object) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def env_int(environ: Mapping[str, str], name: str, default: int) -> int:
    text = environ.get(name, "").strip()
    try:
        return int(text) if text else default
    except ValueError:
        raise ValueError(f"{name} must be an integer, got {text!r}") from None


def env_float(environ: Mapping[str, str], name: str, default: float) -> float:
    text = environ.get(name, "").strip()
    try:
        return float(text) if text else default
    except ValueError:
        raise ValueError(f"{name} must be a number, got {text!r}") from None


def env_bool(environ: Mapping[str, str], name: str, default: bool) -> bool:
    """true/false, also on/off, yes/no, 1/0; empty or unset: `default`."""
    text = environ.get(name, "").strip().lower()
    if not text:
        return default
    if text in ("1", "true", "yes", "on"):
        return True
    if text in ("0", "false", "no", "off"):
        return False
    raise ValueError(f"{name} must be true or false (on or off), got {text!r}")


def env_optional_port(environ: Mapping[str, str], name: str, default: int | None) -> int | None:
    """A port number, 0 for any free one, or `off` (also `none`, `false`) for none."""
    text = environ.get(name, "").strip().lower()
    if text in ("off", "none", "false"):
        return None
    return env_int(environ, name, default) if text else default


_HOST_PORT = re.compile(r"(\[[0-9A-Fa-f:.]+\]|[^\s:/\[\]]+):([0-9]{1,5})")
_GRPC_SCHEMES = ("dns:", "unix:", "unix-abstract:", "ipv4:", "ipv6:", "vsock:")  # gRPC's own name resolvers


MAX_SHUTDOWN_GRACE_S = 3600.0  # BEAR_SHUTDOWN_GRACE_S at most: calls in flight never hold a SIGTERM for longer


def port_problem(name: str, port: int | None, *, off_allowed: bool = False) -> str | None:
    """What is wrong with a port setting (None: a port number, or None where "off" is allowed)."""
    if port is None and off_allowed:
        return None
    if port is not None and 0 <= port < 65536:
        return None
    return f"{name} must be a port number (0-65535){' or off' if off_allowed else ''}, got {port}"


def shutdown_grace_problem(value: float) -> str | None:
    """What is wrong with a BEAR_SHUTDOWN_GRACE_S (None: nothing)."""
    if not (math.isfinite(value) and 0 <= value <= MAX_SHUTDOWN_GRACE_S):
        return f"BEAR_SHUTDOWN_GRACE_S must be in [0, {MAX_SHUTDOWN_GRACE_S:g}] seconds, got {value!r}"
    return None


def folder_problem(name: str, path: str) -> str | None:
    """Why `path`, given as the setting `name`, is not a folder that can be read (None: it is); a name the file
    system refuses (too long) is said so, not raised."""
    try:
        if Path(path).is_dir():
            return None
    except OSError as error:  # ENAMETOOLONG, EACCES on a folder above it
        return f"{name}: {path}: {error.strerror or error}"
    return f"{name}: {path} is not a directory"


def is_utf8(text: str) -> bool:
    """False for a text holding an undecodable byte of the environment or the command line (a lone surrogate): no
    client or server could send it."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def grpc_target_problem(name: str, target: str) -> str | None:
    """Why `target` (the setting `name`) is no gRPC address — host:port, [IPv6]:port or a gRPC resolver's target
    (dns:///host:port, unix:/path, ...) — or None. A URL or a missing port would leave the caller degraded for good
    (an http:// scheme is no gRPC resolver; without a port gRPC dials 443)."""
    if not is_utf8(target):
        return f"{name} is not UTF-8 text: got {target!r}"
    if target.lower().startswith(_GRPC_SCHEMES):
        return None
    if "://" in target:
        return f"{name} is a gRPC address (host:port), not a URL: got {target!r}"
    match = _HOST_PORT.fullmatch(target)
    if match is None or not 0 < int(match.group(2)) < 65536:
        return f"{name} must be host:port (a port in 1-65535), got {target!r}"
    return None
