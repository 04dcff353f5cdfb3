"""Topology files -> validated, immutable networkx graphs; routing."""
from .errors import TopologyError
from .machine import PE, PE_ROLES, IssueCost, Machine, load_machine, topology_path

__all__ = ["TopologyError", "PE", "PE_ROLES", "IssueCost", "Machine", "load_machine", "topology_path"]
