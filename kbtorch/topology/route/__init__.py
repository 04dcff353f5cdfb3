"""Routing over a compiled graph: ``chip`` (the dimension-ordered router of one chip),
``multipath`` (the ``[routing]`` policy: single path or spraying) and ``system`` (routes
between the chips of a system)."""
