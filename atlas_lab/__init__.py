"""atlas-lab: an experiment platform for test-time-memory sequence models."""
__version__ = "0.1.0"
