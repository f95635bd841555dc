"""Measuring: the profiler, the probe and the other runtimes set beside pipecast's.

Each drives the runtime (or another engine) on the machine at hand and returns values.
"""
