"""One exception type for problems a user can fix (bad input, bad config, a busy port).

The CLI prints these as one clear line and exits with status 2; anything else is a bug and keeps
its traceback.
"""


class DraftlabError(Exception):
    """A user-facing error: the message names the file, the key and what was expected."""
