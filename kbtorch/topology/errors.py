"""Errors raised while loading a topology file."""
import difflib


class TopologyError(ValueError):
    """A topology file is malformed; the message names the file and the entry at fault."""

    def __init__(self, path: str, entry: str, message: str):
        self.path, self.entry, self.message = path, entry, message
        super().__init__(f"{path}: {entry}: {message}")


def did_you_mean(word, choices) -> str:
    """`` (did you mean 'x'?)`` for the closest of ``choices`` to ``word``, else ``""``."""
    close = difflib.get_close_matches(str(word), [str(c) for c in choices], n=1)
    return f" (did you mean '{close[0]}'?)" if close else ""
