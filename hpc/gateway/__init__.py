"""`hpc-serve gateway`: one address in front of every READY replica of a deployment.

Why a package of its own: it is the only part of hpc-serve that runs an async web server, and its
dependencies (FastAPI, uvicorn, httpx, tritonclient's asyncio client) are imported only here, so the rest of
the CLI stays fast to start. One module per concern: discovery (which replicas), balancer (which one gets a
request), triton (the gRPC stream to a replica's ensemble), openai_api / passthrough (what clients speak),
auth (the deployment's access token), app (wiring), cli (`hpc-serve gateway`, `hpc-serve token`).
"""
