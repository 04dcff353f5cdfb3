"""The size of a topology (nodes + directed links), computed from array counts and grids
BEFORE expanding, so a file that would expand to millions of elements is refused at once.

Also checks the block nesting: every array names a known block, no block contains itself
and blocks nest at most :data:`MAX_DEPTH` levels (so expanding never recurses deeply).
"""
from __future__ import annotations

import os
import re

from .errors import TopologyError, did_you_mean

DEFAULT_MAX_ELEMENTS = 500_000
ENV_MAX_ELEMENTS = "KBTORCH_MAX_ELEMENTS"
MAX_DEPTH = 32
REF = re.compile(r"^([A-Za-z_][A-Za-z0-9_]*)(?:\[(\*|\d+)\])?$")


def element_limit(path: str, max_elements=None) -> int:
    """``max_elements`` if given, else $KBTORCH_MAX_ELEMENTS, else the default."""
    where = "max_elements"
    if max_elements is None and ENV_MAX_ELEMENTS in os.environ:
        where, max_elements = ENV_MAX_ELEMENTS, os.environ[ENV_MAX_ELEMENTS].strip()
        max_elements = int(max_elements) if max_elements.isascii() and max_elements.isdigit() else max_elements
    if max_elements is None:
        return DEFAULT_MAX_ELEMENTS
    if not isinstance(max_elements, int) or isinstance(max_elements, bool) or max_elements <= 0:
        raise TopologyError(path, where, f"expected a positive integer, got {max_elements!r}")
    return max_elements


def check_size(doc: dict, path: str, limit: int) -> int:
    """The element count of the validated document ``doc``; TopologyError above ``limit``."""
    top = doc["machine"]["top"]
    total, _ = _Counter(doc["blocks"], path).count(top, "machine.top", ())
    if total > limit:
        raise TopologyError(path, "machine.top",
                            f"block '{top}' expands to {total} elements (nodes + directed links), more than "
                            f"the limit of {limit}; raise it with max_elements=N or ${ENV_MAX_ELEMENTS}")
    return total


def array_shape(arr: dict) -> list:
    return arr["grid"] if "grid" in arr else [arr["count"]]


def product(shape) -> int:
    total = 1
    for s in shape:
        total *= s
    return total


class _Counter:
    """Counts per block (memoized): a block's elements do not depend on where it is used."""

    def __init__(self, blocks: dict, path: str):
        self.blocks, self.path = blocks, path
        self.memo: dict[str, tuple[int, int]] = {}     # block -> (elements, nesting height)

    def count(self, name: str, where: str, stack: tuple) -> tuple[int, int]:
        if name not in self.blocks:
            raise TopologyError(self.path, where, f"unknown block '{name}'{did_you_mean(name, self.blocks)}")
        if name in stack:
            cycle = " -> ".join(stack[stack.index(name):] + (name,))
            raise TopologyError(self.path, f"blocks.{name}", f"block contains itself ({cycle})")
        if len(stack) >= MAX_DEPTH or len(stack) + self.memo.get(name, (0, 0))[1] > MAX_DEPTH:
            raise TopologyError(self.path, f"blocks.{name}", f"blocks nest deeper than {MAX_DEPTH} levels "
                                f"({' -> '.join(stack[:3])} -> ... -> {name})")
        if name not in self.memo:
            self.memo[name] = self.measure(name, stack + (name,))
        return self.memo[name]

    def measure(self, name: str, stack: tuple) -> tuple[int, int]:
        spec = self.blocks[name]
        total, height = len(spec.get("nodes", {})), 1
        for arr_name, arr in spec.get("arrays", {}).items():
            shape = array_shape(arr)
            inner, below = self.count(arr["block"], f"blocks.{name}.arrays.{arr_name}.block", stack)
            total += product(shape) * inner
            height = max(height, below + 1)
            dims = arr.get("dims", [arr_name] if len(shape) == 1 else [])
            for rule in arr.get("connect", []):
                if rule["dim"] in dims and len(dims) == len(shape):
                    n = shape[dims.index(rule["dim"])]
                    total += 2 * (product(shape) // n) * (n - 1 + (rule.get("wrap", False) and n > 1))
        for link in spec.get("links", []):
            b = link["b"] if isinstance(link["b"], list) else [link["b"]]
            pairs = max(self.ref_count(link["a"], spec), sum(self.ref_count(r, spec) for r in b))
            total += pairs * (2 if link.get("dir", "both") == "both" else 1)
        return total, height

    def ref_count(self, ref: str, spec: dict) -> int:
        """How many nodes a reference like ``cube[*].pe[*].tcm`` names (1 if malformed: the
        expander reports it)."""
        count, cur = 1, spec
        for part in ref.split("."):
            m = REF.match(part)
            arr = cur.get("arrays", {}).get(m.group(1)) if m and m.group(2) is not None else None
            if arr is None:
                return count
            if m.group(2) == "*":
                count *= product(array_shape(arr))
            cur = self.blocks.get(arr["block"], {})
        return count
