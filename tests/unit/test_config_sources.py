"""Settings layered from a YAML file, the environment and flags, all as environment strings."""

from __future__ import annotations

import argparse
import importlib
from pathlib import Path

import pytest

from bear.common.config_sources import (ConfigFileError, add_flags, env_bool, env_int, env_optional_port,
                                        flag_values, given_as, layered_environ, load_layered)

KNOWN = ("BEAR_A_S", "BEAR_FLAG", "BEAR_PORT")


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "settings.yaml"
    path.write_text(text)
    return path


def test_file_then_environment_then_flags(tmp_path: Path) -> None:
    path = write(tmp_path, "a_s: 1.5\nflag: true\nport: 80\n")
    merged = layered_environ({"BEAR_PORT": "81", "HOME": "/root"}, path, {"BEAR_A_S": 2, "BEAR_FLAG": None}, KNOWN)
    assert merged["BEAR_A_S"] == "2" and merged["BEAR_FLAG"] == "true" and merged["BEAR_PORT"] == "81"
    assert merged["HOME"] == "/root"


@pytest.mark.parametrize(("text", "message"), [
    ("- a\n- b\n", "expected a mapping of settings, got list"),
    ("a_s: [1, 2]\n", "a_s must be a single value"),
    ("b: 1\n", "unknown setting 'b' .known: a_s, flag, port."),
    ("a_s: [\n", "config file .*settings.yaml"),
    ("port: 80\nflag: true\nport: 81\n", "(?s)config file .*settings.yaml: .*the key 'port' appears a second time"),
    ("port: 0\nPORT: 81\n", "'PORT': settings are written in lower case \\('port'\\)"),  # past the duplicate check
    ("null: 1\n", "a key is null, which names no setting .known: a_s, flag, port."),  # (QA: "None: ... lower case")
    ("~: 1\n", "a key is null"),
])
def test_a_bad_file_is_named(tmp_path: Path, text: str, message: str) -> None:
    with pytest.raises(ConfigFileError, match=message):
        layered_environ({}, write(tmp_path, text), {}, KNOWN)


@pytest.mark.parametrize(("text", "value"), [
    ("a_s: 0123\n", "0123"), ("a_s: 12:30\n", "12:30"), ("flag: yes\n", "yes"), ("flag: on\n", "on"),
    ("a_s: 1.50\n", "1.50"), ("flag: True\n", "True"), ("a_s: '0123'\n", "0123"), ("a_s: !!int 0x10\n", "16"),
])
def test_a_files_value_is_the_text_written_as_in_the_environment(tmp_path: Path, text: str, value: str) -> None:
    """(QA: YAML 1.1 read `0123` as 83, `12:30` as 750, `yes` as true, so that a password or a port in the file meant
    something else than the same text in an environment variable.)"""
    merged = layered_environ({}, write(tmp_path, text), {}, KNOWN)
    assert list(merged.values()) == [value]


def test_null_and_merge_keys_keep_their_meaning(tmp_path: Path) -> None:
    assert layered_environ({}, write(tmp_path, "a_s: ~\nflag:\nport: null\n"), {}, KNOWN) == {}
    merged = layered_environ({}, write(tmp_path, "<<: {port: 080, a_s: 1}\na_s: 2\n"), {}, KNOWN)
    assert merged == {"BEAR_PORT": "080", "BEAR_A_S": "2"}


def test_a_file_that_is_not_utf8_text_is_named(tmp_path: Path) -> None:
    path = tmp_path / "binary.yaml"
    path.write_bytes(b"\xff\xfe\x00bad")
    with pytest.raises(ConfigFileError, match=f"config file {path}: not UTF-8 text"):
        layered_environ({}, path, {}, KNOWN)


def test_an_empty_or_blank_variable_counts_as_unset(tmp_path: Path) -> None:
    merged = layered_environ({"BEAR_PORT": "", "BEAR_A_S": "  "}, write(tmp_path, "port: 80\n"), {}, KNOWN)
    assert merged["BEAR_PORT"] == "80" and "BEAR_A_S" not in merged


@pytest.mark.parametrize(("service", "text"), [
    ("predictor", "predictor_model_dir: /artifact\npredictor_grpc_port: 50111\n"),
    ("estimator", "estimator_grpc_port: 50111\n"),
    ("router", "router_grpc_port: 50111\n"),
])
def test_every_service_takes_the_files_value_over_an_empty_variable(tmp_path: Path, service: str, text: str) -> None:
    load = importlib.import_module(f"bear.{service}.config").load
    empty = {f"BEAR_{line.split(':')[0].upper()}": "" for line in text.splitlines()}
    assert load({}, str(write(tmp_path, text)), empty).grpc_port == 50111


def test_a_missing_file_is_named(tmp_path: Path) -> None:
    with pytest.raises(ConfigFileError, match="missing.yaml"):
        layered_environ({}, tmp_path / "missing.yaml", {}, KNOWN)


@pytest.mark.parametrize(("text", "port"), [("", 9464), ("0", 0), ("9000", 9000), ("off", None), ("None", None)])
def test_an_optional_port(text: str, port: int | None) -> None:
    assert env_optional_port({"P": text}, "P", 9464) == port


@pytest.mark.parametrize(("text", "default", "value"), [
    ("", True, True), ("", False, False), (" On ", False, True), ("true", False, True), ("1", False, True),
    ("yes", False, True), ("off", True, False), ("FALSE", True, False), ("0", True, False), ("no", True, False)])
def test_a_switch(text: str, default: bool, value: bool) -> None:
    assert env_bool({"BEAR_X": text}, "BEAR_X", default) is value
    assert env_bool({}, "BEAR_X", default) is default


def test_a_bad_switch_is_named() -> None:
    with pytest.raises(ValueError, match=r"BEAR_X must be true or false \(on or off\), got 'maybe'"):
        env_bool({"BEAR_X": "maybe"}, "BEAR_X", True)


@pytest.mark.parametrize("value", ["", "   "])
@pytest.mark.parametrize("flag", ["--grpc-port", "--config"])
def test_a_flag_given_empty_is_refused_by_name(value: str, flag: str, capsys: pytest.CaptureFixture[str]) -> None:
    """`--grpc-port "$PORT"` with PORT unset must not quietly override the environment and the file with the default
    (nor `--config "$FILE"` leave the file out)."""
    parser = argparse.ArgumentParser(prog="bear serve x")
    add_flags(parser, {"--grpc-port": ("BEAR_PORT", "gRPC port")})
    assert flag_values(parser.parse_args(["--grpc-port", "81"]), {"--grpc-port": ("BEAR_PORT", "")}) == {
        "BEAR_PORT": "81"}
    with pytest.raises(SystemExit) as exited:
        parser.parse_args([flag, value])
    assert exited.value.code == 2
    assert f"argument {flag}: empty value" in capsys.readouterr().err


@pytest.mark.parametrize("flag", ["--redis-url", "--instance-id", "--pool", "--model", "--endpoint", "--region",
                                  "--metrics-port"])
def test_the_snapshotters_text_flags_given_empty_are_refused(flag: str, capsys: pytest.CaptureFixture[str]) -> None:
    """An empty --redis-url meant the embedded Redis: a sidecar publishing where no estimator looks."""
    from bear.snapshotter.serve import add_arguments

    parser = argparse.ArgumentParser(prog="bear snapshotter")
    add_arguments(parser)
    with pytest.raises(SystemExit):
        parser.parse_args([flag, ""])
    assert f"argument {flag}: empty value" in capsys.readouterr().err


@pytest.mark.parametrize("argv", [["serve", "router", "--grpc", "9000"], ["serve", "estimator", "--redis", "x"],
                                  ["demo", "--dur", "5"]])
def test_flags_are_taken_by_their_whole_names_only(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    """argparse would take `--grpc` for `--grpc-port`: the Helm chart could not tell that an extra argument sets a
    flag it sets itself, and a new flag could change what an old abbreviation meant."""
    from bear.cli.main import build_parser

    with pytest.raises(SystemExit) as exit_:
        build_parser().parse_args(argv)
    assert exit_.value.code == 2
    assert f"unrecognized arguments: {argv[-2]}" in capsys.readouterr().err


@pytest.mark.parametrize("service", ["router", "estimator", "predictor"])
@pytest.mark.parametrize("grace", ["inf", "nan", "-1", "1e300"])
def test_every_service_refuses_a_shutdown_grace_that_would_hold_a_sigterm_for_ever(service: str, grace: str) -> None:
    load = importlib.import_module(f"bear.{service}.config").load
    with pytest.raises(ValueError, match=r"BEAR_SHUTDOWN_GRACE_S must be in \[0, 3600\] seconds"):
        load({}, environ={"BEAR_SHUTDOWN_GRACE_S": grace, "BEAR_PREDICTOR_MODEL_DIR": "/"})


FLAG_TABLE = {"--port": ("BEAR_PORT", "the port"), "--a-s": ("BEAR_A_S", "a time")}


def _parse(environ: object) -> tuple[int, int]:
    assert isinstance(environ, dict)
    port, a_s = env_int(environ, "BEAR_PORT", 1), env_int(environ, "BEAR_A_S", 1)
    if port > 65535:
        raise ValueError(f"BEAR_PORT must be a port number, got {port}")
    return port, a_s


@pytest.mark.parametrize(("environ", "text", "flags", "message"), [
    ({}, "", {"BEAR_PORT": "x"}, r"^BEAR_PORT must be an integer, got 'x' \(given as --port\)$"),
    ({}, "port: 70000\n", {}, r"^BEAR_PORT must be a port number, got 70000 \(given as port in config file .*$"),
    ({"BEAR_PORT": "x"}, "port: 80\n", {}, r"^BEAR_PORT must be an integer, got 'x'$"),  # the environment: named
    ({"BEAR_PORT": "80"}, "", {"BEAR_A_S": "y"}, r"^BEAR_A_S must be an integer, got 'y' \(given as --a-s\)$"),
])
def test_an_error_says_which_flag_or_file_key_gave_the_setting(tmp_path: Path, environ: dict[str, str], text: str,
                                                               flags: dict[str, object], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        load_layered(_parse, environ, write(tmp_path, text) if text else None, flags, KNOWN, FLAG_TABLE)
    assert load_layered(_parse, {"BEAR_PORT": "80"}, None, {"BEAR_A_S": 3}, KNOWN, FLAG_TABLE) == (80, 3)


def test_given_as_names_several_settings_once_each_and_leaves_other_errors_alone() -> None:
    sources = {"BEAR_PORT": "--port", "BEAR_A_S": "a_s in config file f.yaml"}
    with pytest.raises(ValueError, match=r"^BEAR_A_S > BEAR_PORT \(BEAR_PORT given as --port; BEAR_A_S given as "
                                         r"a_s in config file f.yaml\)$"):
        with given_as(sources):
            raise ValueError("BEAR_A_S > BEAR_PORT")
    with pytest.raises(ValueError, match=r"^BEAR_PORT \(--port\) is wrong$"):  # the flag named already
        with given_as(sources):
            raise ValueError("BEAR_PORT (--port) is wrong")
    with pytest.raises(ValueError, match=r"^BEAR_PORTS is wrong$"):  # another setting's name
        with given_as(sources):
            raise ValueError("BEAR_PORTS is wrong")
    with pytest.raises(ConfigFileError, match=r"^BEAR_PORT in a subclass$"):  # its own message kept
        with given_as(sources):
            raise ConfigFileError("BEAR_PORT in a subclass")


def test_a_misspelled_variable_is_warned_about_and_the_other_services_are_not(
        caplog: pytest.LogCaptureFixture) -> None:
    """(QA: BEAR_PREDICTOR_GRCP_PORT=0 and BEAR_PREDICTOR_WORKER=1 were ignored without a word: the defaults served.)
    Pods share one environment: no BEAR_* name anywhere in BEAR is taken for a typo of another service's."""
    import re
    import subprocess

    from bear.common.config_sources import misspelled
    from bear.discovery.config import ENVIRONMENT as DISCOVERY
    from bear.estimator.config import ENVIRONMENT as ESTIMATOR
    from bear.predictor.config import ENVIRONMENT as PREDICTOR
    from bear.router.config import ENVIRONMENT as ROUTER

    root = Path(__file__).resolve().parents[2]
    sources = subprocess.run(["git", "-C", str(root), "grep", "-h", "-o", "-E", '"BEAR_[A-Z0-9_]+"', "--", "*.py",
                              ":!tests"], capture_output=True, text=True, check=True).stdout
    every_name = {name for name in re.findall(r'"(BEAR_[A-Z0-9_]+)"', sources)} | set(DISCOVERY)
    assert len(every_name) > 60
    for known in (ESTIMATOR, PREDICTOR, ROUTER):
        assert misspelled(dict.fromkeys(every_name, "1"), known) == []
    environ = {"BEAR_PREDICTOR_GRCP_PORT": "0", "BEAR_PREDICTOR_WORKER": "1", "BEAR_REDIS_ULR": "redis://r:6379",
               "BEAR_HELM_PYTHON": "/x", "PREDICTOR_WORKERS": "2"}
    assert misspelled(environ, PREDICTOR) == [("BEAR_PREDICTOR_GRCP_PORT", "BEAR_PREDICTOR_GRPC_PORT"),
                                              ("BEAR_PREDICTOR_WORKER", "BEAR_PREDICTOR_WORKERS")]
    assert misspelled(environ, ROUTER) == [("BEAR_REDIS_ULR", "BEAR_REDIS_URL")]
    with caplog.at_level("WARNING", logger="bear.config"):
        load_layered(dict, {"BEAR_PORTT": "1"}, None, {}, KNOWN, {})
    assert [r.getMessage() for r in caplog.records] == [
        "BEAR_PORTT is not a setting of this service: ignored (did you mean BEAR_PORT?)"]


@pytest.mark.parametrize("text", ["port: [::1]\n", "flag: 1\nport: [::]\n", "port: [fd00::5]\n"])
def test_an_ipv6_host_in_brackets_gets_told_to_quote_it(tmp_path: Path, text: str) -> None:
    """(QA: `predictor_host: [::1]`, as BEAR's own messages write an IPv6 host, failed with PyYAML's bare "did not find
    expected node content", naming neither the setting nor the fix.)"""
    with pytest.raises(ConfigFileError, match=r"\(quote a value that starts with '\[', e.g. port: '\[::1\]'\)$"):
        layered_environ({}, write(tmp_path, text), {}, KNOWN)
    assert layered_environ({}, write(tmp_path, "port: '[::1]'\n"), {}, KNOWN)["BEAR_PORT"] == "[::1]"
