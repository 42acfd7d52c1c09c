"""Names, records and plans that the login node, the job scripts, the ranks and the models share: one definition each (stdlib only)."""
