"""Command registries: handlers keyed by command type, a clear error for a type without one."""
from dataclasses import dataclass

import pytest

from kbtorch.sim import resources, symmetry
from kbtorch.sim.commands import Command, Compute, Composite, Dma, Fetch, Multicast, Send, Store
from kbtorch.sim.components import pe
from kbtorch.sim.registry import Registry, UnknownCommand
from kbtorch.sim.simulator import Simulator


@dataclass(frozen=True)
class Halt(Command):
    """A command type no registry knows."""

    engine: str = "math"


@dataclass(frozen=True)
class SlowCompute(Compute):
    """A subclass of a registered type."""


def test_handlers_are_found_by_type_and_subclasses_inherit():
    reg = Registry("demo")

    @reg.register(Compute, Dma)
    def handle(cmd):
        return "done"

    assert reg[Compute] is handle and reg[Dma] is handle
    assert reg[SlowCompute] is handle


def test_an_unregistered_type_is_named():
    reg = Registry("demo")
    reg.register(Dma)(print)
    with pytest.raises(UnknownCommand, match="demo: no handler for command type Halt .registered: Dma."):
        reg[Halt]


def test_a_type_is_registered_once():
    reg = Registry("demo")
    reg.register(Dma)(print)
    with pytest.raises(ValueError, match="Dma is already registered"):
        reg.register(Dma)(repr)


@pytest.mark.parametrize("registry", [pe.EXECUTE, symmetry.PATHS, resources.LOAD])
def test_every_command_type_has_a_handler_in_every_registry(registry):
    assert set(registry.own) == {Dma, Compute, Send, Fetch, Store, Composite, Multicast}


def test_simulating_an_unregistered_command_names_it(ahbm):
    with pytest.raises(UnknownCommand, match="PE execute: no handler for command type Halt"):
        Simulator(ahbm).run({0: [Halt()]})


def test_reducing_and_costing_an_unregistered_command_names_it(ahbm):
    with pytest.raises(UnknownCommand, match="symmetry paths: no handler for command type Halt"):
        symmetry.reduce(ahbm, {0: [Halt()], 1: [Halt()]})
    with pytest.raises(UnknownCommand, match="resource load: no handler for command type Halt"):
        resources.resource_ps(ahbm, {0: [Halt()]})
