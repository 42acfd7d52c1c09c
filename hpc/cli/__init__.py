"""The `hpc-serve` command line: argument parsing and output; each command calls the role package that does the work."""
