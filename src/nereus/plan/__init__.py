"""The best plan: candidates per model-stage, frontiers, exact search, placement."""
