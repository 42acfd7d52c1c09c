"""Steps the job scripts (.sub, build.sub) run besides the ranks: renewal and the build record (stdlib only)."""
