"""YAML as BEAR's files are read: safe (no Python objects), a mapping that names a key twice is an error, and a number
with an exponent is a number (`1e-9`, `1.5e3`), as in YAML 1.2.

PyYAML keeps the last of two equal keys without a word, so a setting written twice in a config, pools or catalogue
file (`price: 1` near the top, `price: 2` further down, the first one forgotten) would silently take one of them.
"""

from __future__ import annotations

import errno
import os
import re
import stat
from pathlib import Path
from typing import Any

import yaml

MAX_FILE_BYTES = 16 * 2**20  # a settings, pools or catalogue file at most (thousands of instances take a few MiB)


class DuplicateKeyError(yaml.constructor.ConstructorError):
    """A mapping names the same key twice (a yaml.YAMLError, so callers' YAML errors cover it)."""

    def __str__(self) -> str:
        mark = self.problem_mark
        return f"line {mark.line + 1}: {self.problem}" if mark is not None else str(self.problem)


# PyYAML's C parser where the wheel has it (about 10x faster on large pools files), its pure-Python one otherwise; the
# constructor, and with it the check below, is Python in both.
_SafeLoader: type[yaml.SafeLoader] = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


class _StrictLoader(_SafeLoader):  # type: ignore[valid-type,misc]
    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: dict[Any, yaml.Mark] = {}
        for key_node, _ in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":  # `<<: *base`: the keys written beside it override its
                continue
            key = self.construct_object(key_node, deep=True)
            try:
                earlier = seen.get(key)
            except TypeError:  # an unhashable key: SafeLoader's own error says so below
                continue
            if earlier is not None:
                problem = f"the key {key!r} appears a second time in one mapping (first on line {earlier.line + 1})"
                raise DuplicateKeyError(None, None, problem, key_node.start_mark)
            seen[key] = key_node.start_mark
        return super().construct_mapping(node, deep=deep)


# YAML 1.1 (PyYAML) reads a number with an exponent as one only if it has a dot and a signed exponent: `1e-9` or
# `1.5e3` would be text, and a price written so refused as no number. YAML 1.2 and JSON take them as the floats they
# look like.
_StrictLoader.add_implicit_resolver(
    "tag:yaml.org,2002:float", re.compile(r"^[-+]?(?:\.[0-9]+|[0-9]+(?:\.[0-9]*)?)[eE][-+]?[0-9]+$"),
    list("-+.0123456789"))


class _TextLoader(_StrictLoader):
    """Plain scalars as written: YAML 1.1's implicit types (`0123` octal, `12:30` sexagesimal, `yes`/`no`/`on`/`off`
    booleans) would make a setting in a file mean something else than the same text in an environment variable.
    Only null (an empty value, `~`, `null`) and merge keys (`<<`) keep their meaning; quoting and explicit tags too."""

    yaml_implicit_resolvers = {
        first: [(tag, pattern) for tag, pattern in resolvers
                if tag in ("tag:yaml.org,2002:null", "tag:yaml.org,2002:merge")]
        for first, resolvers in _StrictLoader.yaml_implicit_resolvers.items()
    }


def load_yaml(text: str, *, scalars_as_text: bool = False) -> Any:
    """One YAML document, as yaml.safe_load reads it (with `scalars_as_text`, plain scalars other than null stay the
    text written), but a repeated key in any mapping raises DuplicateKeyError."""
    return yaml.load(text, Loader=_TextLoader if scalars_as_text else _StrictLoader)  # noqa: S506 - SafeLoader's


def read_settings_file(path: Path | str, max_bytes: int = MAX_FILE_BYTES) -> str:
    """The UTF-8 text of a file a user names (config, pools, catalogue). Only a regular file of at most `max_bytes`:
    a FIFO would hold the start (opening it waits for a writer, deaf to signals), /dev/zero would never end. Raises
    OSError (its strerror saying why) or UnicodeDecodeError."""
    with open(path, "rb", opener=lambda name, flags: os.open(name, flags | os.O_NONBLOCK)) as source:
        if not stat.S_ISREG(os.fstat(source.fileno()).st_mode):
            raise OSError(errno.EINVAL, "not a regular file")
        data = source.read(max_bytes + 1)
    if len(data) > max_bytes:
        raise OSError(errno.EFBIG, f"larger than {max_bytes} bytes")
    return data.decode("utf-8")
