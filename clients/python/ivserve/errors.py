"""The one exception type of the client.

Every failure the client reports reaches the caller as IvserveError: an
error answer of the server (its HTTP status and the code and message of
its JSON body), an error trailer at the end of a stream that had already
started, a stream cut before its trailer, or a connection that failed.
One type lets a caller write a single `except` around any call.
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
