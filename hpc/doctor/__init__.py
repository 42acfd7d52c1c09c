"""`hpc-serve doctor`: checks a cluster against what a spec (or hpc-serve in general) needs, and says how to fix
what is missing.

One module per concern: `parse` (what Slurm's commands print), `login` (the checks from the login node), `facts`
(what they found, and the partition and time judgments the serving and the gateway job share), `gateway` (the
gateway job's checks), `probe` and `node` (the `--probe` job and what it runs on a compute node), `report` (the
checks' results and the rich table), `profile` (`--write-profile`), `verdicts` (the probe job's checks), `serve`
and `battery` (`--serve`: a job of the spec, the requests against it, its ordered stop; `serve_options` its CLI
defaults), `cli` (the command).
"""
