"""Loading a topology file, as a straight line: ``sources`` (resolve a name or path, read the
file and a system's chip file once) -> ``parse`` (TOML) -> ``schema`` and ``validate`` (every
check of a document and of its compiled graph) -> ``expand`` (arrays of blocks to nodes and
links) -> ``cache`` (one cache keyed by content); ``pipeline`` drives the line, with
``overrides`` applied to the document on the way."""
