"""How much a model-stage candidate costs: op list, latency, peak memory, calibration."""
