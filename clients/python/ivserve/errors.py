"""The one exception type of the client.

Every failure the client reports reaches the caller as IvserveError: an
error answer of the server (its HTTP status and the code and message of
its JSON body), an error trailer at the end of a stream that had already
started, a stream cut before its trailer, or a connection that failed.
One type lets a caller write a single `except` around any call; a
missing name is also a KeyError and a position out of range also an
IndexError (subclasses below), where Python users expect those.
"""


class IvserveError(Exception):
    """A failed request.

    status: the HTTP status (an int), or None when no answer came (a
    connection error). code: the server's short error code ("not_found",
    "bad_filter", ...) or the client's ("connection", "truncated",
    "bad_stream", "bad_selection"). message: the human-readable reason.
    """

    def __init__(self, status, code, message):
        super().__init__(f"{status if status is not None else '-'} {code}: {message}")
        self.status = status
        self.code = code
        self.message = message


class IvserveKeyError(IvserveError, KeyError):
    """A name that is not there (a cell, gene, column, obsm array or
    matrix): an IvserveError that `except KeyError` also catches, as for
    a missing label in pandas or a missing key of a mapping."""

    def __str__(self):  # KeyError's own would quote the message
        return Exception.__str__(self)


class IvserveIndexError(IvserveError, IndexError):
    """A position out of bounds or a mask of the wrong length: an
    IvserveError that `except IndexError` also catches, as numpy raises."""


# Server error codes that mean a missing name (KeyError) or a position out
# of range (IndexError) to a Python caller.
KEY_CODES = {"unknown_name", "unknown_column", "unknown_matrix"}
INDEX_CODES = {"out_of_range"}


def make_error(status, code, message):
    """The IvserveError subclass a Python caller expects for code."""
    if code in KEY_CODES:
        return IvserveKeyError(status, code, message)
    if code in INDEX_CODES:
        return IvserveIndexError(status, code, message)
    return IvserveError(status, code, message)
