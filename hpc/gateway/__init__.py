"""`hpc-serve gateway`: one address in front of every READY replica of a deployment.

Why a package of its own: it is the only part of hpc-serve that runs an async web server, and FastAPI, Starlette and
uvicorn are imported only here, so the rest of the CLI stays fast to start. Reaching replicas (discovery, balancing,
the retry rule, Triton's gRPC stream, tokens) is hpc/serving's, shared with the Python client. One module per
concern: serve (run one gateway and publish its address), workers (a gateway of several processes on one
port), app (wiring), state (what routes share, `routed`),
openai_api / fanout / choices / logprobs / bodies / answers (the OpenAI API: requests and answers as models),
passthrough (Triton's HTTP API), liveness, metrics, accesslog, auth (the clients' token), errors, streaming
(`EventStream`), fastpath, bodylimit, connections (the middleware and connection bounds). The commands themselves
are hpc/cli/gateway.py's.
"""
