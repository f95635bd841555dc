"""Simulation of Plans in time: costs, the event-driven engine, timelines, closed forms."""

from pipecast.simulation.costs import Costs, StageTimes, costs_from_profile
from pipecast.simulation.simulator import simulate
from pipecast.simulation.timeline import Event, Timeline

__all__ = ["Costs", "Event", "StageTimes", "Timeline", "costs_from_profile", "simulate"]
