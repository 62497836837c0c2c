"""BEAR's YAML files: read as yaml.safe_load reads them, but a key named twice in a mapping is an error."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from bear.common.yaml_files import DuplicateKeyError, load_yaml

DOCUMENTS = [
    "a: 1\nb: {c: [1, 2.5, x]}\n",
    "- {x: 1}\n- {x: 2}\n",
    "",
    "base: &b {a: 1, b: 2}\nd:\n  <<: *b\n  a: 3\n",  # a merge key's keys are overridden by those written beside it
    "1: one\n'1': string one\n",  # an integer and a string are two keys
]


@pytest.mark.parametrize("text", DOCUMENTS)
def test_documents_read_as_safe_load_reads_them(text: str) -> None:
    assert load_yaml(text) == yaml.safe_load(text)


@pytest.mark.parametrize(("text", "key", "first_line", "line"), [
    ("port: 80\nhost: a\nport: 81\n", "port", 1, 3),
    ("pools:\n  - name: small\n    model: m\n    name: large\n", "name", 2, 4),
    ("a: 1\n'a': 2\n", "a", 1, 2),  # quoted or not, the same string
    ("x: [{k: 1, k: 2}]\n", "k", 1, 1),
])
def test_a_key_named_twice_is_refused_with_both_lines(text: str, key: str, first_line: int, line: int) -> None:
    expected = f"line {line}: the key '{key}' appears a second time in one mapping .first on line {first_line}.$"
    with pytest.raises(DuplicateKeyError, match=expected) as raised:
        load_yaml(text)
    assert raised.value.problem_mark is not None and raised.value.problem_mark.line + 1 == line
    assert isinstance(raised.value, yaml.YAMLError)  # what the files' readers already catch


def test_a_number_with_an_exponent_is_a_number() -> None:
    """(QA: `input_usd_per_mtok: 1e-9`, the pools README's way to make a pool cost nothing, was the text '1e-9' to
    PyYAML's YAML 1.1 reader and refused as no number.)"""
    assert load_yaml("a: 1e-9\nb: -2E+3\nc: 1.5e3\nd: '1e-9'\ne: 1e\nf: 10\ng: .5e1\nh: 1.5\n") == {
        "a": 1e-9, "b": -2000.0, "c": 1500.0, "d": "1e-9", "e": "1e", "f": 10, "g": 5.0, "h": 1.5}
    assert load_yaml("a: 1e-9\n", scalars_as_text=True) == {"a": "1e-9"}  # settings files keep the text written


def test_it_constructs_no_python_objects() -> None:
    with pytest.raises(yaml.constructor.ConstructorError):
        load_yaml("!!python/object/apply:os.system ['true']\n")


def test_a_settings_file_is_a_regular_file_of_bounded_size(tmp_path: Path) -> None:
    """(QA: a FIFO as the pools file held the router's start for ever, deaf to SIGTERM; /dev/zero as a pools, config
    or catalogue file grew the process until it was killed.)"""
    import os

    from bear.common.yaml_files import read_settings_file

    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    for path in (fifo, Path("/dev/zero"), tmp_path):
        with pytest.raises(OSError) as raised:
            read_settings_file(path)
        assert raised.value.strerror in ("not a regular file", "Is a directory")
    large = tmp_path / "large.yaml"
    large.write_text("a: 1\n" * 10)
    assert read_settings_file(large, max_bytes=50) == "a: 1\n" * 10
    with pytest.raises(OSError, match="larger than 49 bytes"):
        read_settings_file(large, max_bytes=49)
