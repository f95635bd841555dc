"""Planning: pure functions over values, no process group and no runtime.

Partition algorithms, the schedule generators, the simulator and the recommender's
enumerate, predict and rank. Everything here runs in milliseconds on a CPU.
"""
