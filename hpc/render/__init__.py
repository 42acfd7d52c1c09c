"""Rendering a spec into a job's files: the .sub, the per-rank script, the Triton model repository, GPU binding."""
