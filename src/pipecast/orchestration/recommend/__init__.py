"""A recommendation end to end: calibration, ranking and validation by measurement."""
