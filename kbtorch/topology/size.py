"""The shapes of a topology's arrays and its node references, shared by the size check
(``validate.check_size``, before expanding) and the expander (``expand``)."""
from __future__ import annotations

import re

REF = re.compile(r"^([A-Za-z_][A-Za-z0-9_]*)(?:\[(\*|\d+)\])?$")


def array_shape(arr: dict) -> list:
    return arr["grid"] if "grid" in arr else [arr["count"]]


def product(shape) -> int:
    total = 1
    for s in shape:
        total *= s
    return total
