"""Shared test settings: deterministic hypothesis profile."""

from hypothesis import HealthCheck, settings

settings.register_profile("nereus", derandomize=True, deadline=None, print_blob=True,
                          suppress_health_check=[HealthCheck.too_slow])
settings.load_profile("nereus")
