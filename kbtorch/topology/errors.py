"""Errors raised while loading a topology file."""


class TopologyError(ValueError):
    """A topology file is malformed; the message names the file and the entry at fault."""

    def __init__(self, path: str, entry: str, message: str):
        self.path, self.entry, self.message = path, entry, message
        super().__init__(f"{path}: {entry}: {message}")
