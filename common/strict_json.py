"""JSON read strictly, for files a user hands BEAR: a key given twice in one object is an error (the json module keeps
the last one silently), and whatever the json module raises on a text it cannot take (bad syntax, nesting past the
recursion limit, an integer of more digits than Python converts) is one JsonError with a short reason."""

from __future__ import annotations

import json
from typing import Any

from bear.common.messages import shown


class JsonError(ValueError):
    """The text is not JSON this reader takes; the message says why (for the caller to prefix with where)."""


def loads(text: str) -> Any:
    try:
        return json.loads(text, object_pairs_hook=_no_key_twice)
    except JsonError:
        raise
    except json.JSONDecodeError as error:
        raise JsonError(f"not valid JSON: {error}") from None
    except RecursionError:
        raise JsonError("not valid JSON: it nests arrays or objects too deeply") from None
    except ValueError as error:  # an integer literal of more digits than Python converts
        reason = str(error).split(";")[0]  # without its advice to raise the interpreter's limit
        raise JsonError(f"not valid JSON: {reason}") from None


def _no_key_twice(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    document: dict[str, Any] = {}
    for key, value in pairs:
        if key in document:
            raise JsonError(f"the key {shown(key)} is given twice in one object")
        document[key] = value
    return document
