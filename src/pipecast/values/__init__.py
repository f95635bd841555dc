"""Values: the typed, JSON-serialisable data that flows between every step of the loop.

Models and data sets, the Profile, the Cluster, the Partition, the Plan (Action, its
validator and unit clock), the Timeline and the Strategy. Nothing here plans, runs or
measures; every other layer imports from here.
"""
