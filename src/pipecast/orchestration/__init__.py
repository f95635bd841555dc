"""Orchestration: what drives everything below it end to end.

One recommendation (defaults, calibration, ranking, validation by measurement) and the
benchmark suites with their runner and results store.
"""
