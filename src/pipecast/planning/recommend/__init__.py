"""The recommender's planning: enumerate strategies, predict each, rank them (pure)."""
