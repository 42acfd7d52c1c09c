"""What each rank runs: `python -m launcher DIR` starts, watches and stops this rank's tritonserver (stdlib only)."""
