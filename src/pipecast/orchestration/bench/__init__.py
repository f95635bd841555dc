"""Benchmark suites, their runner, the results store and accuracy statistics."""
