"""One exception type for problems a user can fix (bad input, bad config, a busy port).

The CLI prints these as one clear line and exits with status 2; anything else is a bug and keeps
its traceback.
"""


class DraftlabError(Exception):
    """A user-facing error: the message names the file, the key and what was expected."""


def require_int(name: str, value: object, minimum: int = 1) -> int:
    """``value`` when it is an integer >= ``minimum``; else the one-line error naming ``name``
    (a ``--batch-size 0`` or ``--max-length -5`` would otherwise run and silently do nothing useful)."""
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise DraftlabError(f"{name}: expected an integer >= {minimum}, got {value!r}")
    return value
