"""Simulation of Plans in time: costs, the event-driven engine, closed forms.

The Timeline it produces is a value (pipecast.values.timeline)."""

from pipecast.planning.simulation.costs import Costs, StageTimes
from pipecast.planning.simulation.pricing import costs_from_profile
from pipecast.planning.simulation.simulator import simulate

__all__ = ["Costs", "StageTimes", "costs_from_profile", "simulate"]
