"""Placements of an ahbm tensor over a mesh of PEs, in the manner of DTensor.

A mesh is a tuple of PE ids, viewed as an n-dimensional grid (``shape``, row-major, e.g.
SIP x CUBE x PE or flat). Along each mesh dimension a tensor is ``Shard(dim)`` (tensor
dimension ``dim`` split into equal chunks, one per mesh coordinate; the last chunks may be
shorter, as ``torch.chunk``), ``Replicate()`` (a full copy at every coordinate) or
``Partial()`` (every coordinate holds a partial sum; the value is their sum).
"""
from __future__ import annotations

from dataclasses import dataclass
from math import prod


@dataclass(frozen=True)
class Shard:
    dim: int

    def __repr__(self) -> str:
        return f"Shard({self.dim})"


@dataclass(frozen=True)
class Replicate:
    def __repr__(self) -> str:
        return "Replicate()"


@dataclass(frozen=True)
class Partial:
    op: str = "sum"

    def __repr__(self) -> str:
        return "Partial()" if self.op == "sum" else f"Partial({self.op!r})"


@dataclass(frozen=True)
class Mesh:
    """PE ids ``pes`` laid out row-major on a grid of ``shape``."""

    pes: tuple
    shape: tuple

    def __post_init__(self):
        if prod(self.shape) != len(self.pes) or not self.pes:
            raise ValueError(f"mesh of shape {self.shape} needs {prod(self.shape)} PEs, got {len(self.pes)}")
        if len(set(self.pes)) != len(self.pes):
            raise ValueError(f"mesh names a PE twice: {list(self.pes)}")


@dataclass(frozen=True)
class Spec:
    """How a tensor of ``shape`` lies on ``mesh``: one placement per mesh dimension."""

    mesh: Mesh
    placements: tuple

    def __post_init__(self):
        if len(self.placements) != len(self.mesh.shape):
            raise ValueError(f"{len(self.placements)} placements for a {len(self.mesh.shape)}-dimensional mesh")
        for p in self.placements:
            if not isinstance(p, (Shard, Replicate, Partial)):
                raise ValueError(f"placement {p!r} is not Shard, Replicate or Partial")

    def check(self, shape: tuple) -> None:
        """Raise ValueError if a placement does not fit a tensor of ``shape``."""
        for p in self.placements:
            if isinstance(p, Shard) and not -len(shape) <= p.dim < len(shape):
                raise ValueError(f"{p!r} of a tensor with {len(shape)} dimensions {tuple(shape)}")

    def __repr__(self) -> str:
        return f"Spec({len(self.mesh.pes)} PEs {self.mesh.shape}, {list(self.placements)})"
