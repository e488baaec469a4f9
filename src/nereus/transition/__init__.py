"""transition layer."""
