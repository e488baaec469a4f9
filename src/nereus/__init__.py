"""Nereus keeps an RL post-training job on its best TP/PP/DP execution plan while it runs."""

__version__ = "0.1.0"
