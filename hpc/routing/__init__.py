"""Which replica serves a request: shared by the gateway (hpc/gateway/) and the Python client (hpc/client.py),
so both follow one policy (`balancer.py`) over one view of a deployment's replicas (`deployment.py`)."""
