"""hpc-serve, submit side: spec → render → submit → track → discover → talk."""

__version__ = "0.1.0"
