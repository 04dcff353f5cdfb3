"""Topology files -> validated, immutable graphs; routing; the machine in use."""
from .errors import TopologyError
from .facts import LEVELS
from .machine import DEFAULT_MACHINE, PE, PE_ROLES, IssueCost, Machine, load_machine, topology_path
from .select import as_machine, current_machine, use

__all__ = ["TopologyError", "LEVELS", "DEFAULT_MACHINE", "PE", "PE_ROLES", "IssueCost", "Machine", "load_machine", "topology_path",
           "as_machine", "current_machine", "use"]
