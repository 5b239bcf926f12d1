"""The single error type of the data pipeline."""

from __future__ import annotations


class DataError(ValueError):
    """A bad data input; the message is one line naming the problem and the fix."""

    def __init__(self, message: str):
        super().__init__(" ".join(str(message).split()))
