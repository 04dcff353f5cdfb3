"""One file per component model."""
