"""Simulation of Plans in time: costs, the event-driven engine, timelines, closed forms."""

from pipecast.simulate.costs import Costs, StageTimes, costs_from_profile
from pipecast.simulate.simulator import simulate
from pipecast.simulate.timeline import Event, Timeline

__all__ = ["Costs", "Event", "StageTimes", "Timeline", "costs_from_profile", "simulate"]
