"""Reaching a running deployment: TARGET resolution, replicas and balancing, tokens, Triton requests. Shared by the gateway web app, the client and the CLI."""
