"""Discrete-event simulation of the modeled hardware (no torch here)."""
