"""How an error message quotes what a caller sent: whole when short, else its beginning and its length. A gRPC status
message travels in a trailer, and gRPC refuses trailers over its metadata limit (8–16 KiB): a message that echoed a
20 kB policy name would turn INVALID_ARGUMENT into RESOURCE_EXHAUSTED on the caller's side. And how a log line names
an exception another library raised (`described`)."""

from __future__ import annotations

MAX_SHOWN_CHARS = 64


def shown(value: object, limit: int = MAX_SHOWN_CHARS) -> str:
    """`value`'s repr, or for a longer text the repr of its first `limit` characters followed by its length (for any
    other value, its repr cut to `limit` characters)."""
    if isinstance(value, str):
        if len(value) <= limit:
            return repr(value)
        return f"{value[:limit]!r}… ({len(value)} characters)"
    text = repr(value)
    return text if len(text) <= limit else f"{text[:limit]}… (a {type(value).__name__})"


def described(error: BaseException) -> str:
    """`error`'s type and message, e.g. "ResponseError: DB index is out of range" (redis-py 8's repr of its errors
    is the type alone, "server:ResponseError", without the message that says what is wrong)."""
    message = str(error)
    return f"{type(error).__name__}: {message}" if message else type(error).__name__
