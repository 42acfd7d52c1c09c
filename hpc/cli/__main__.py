"""`python -m hpc.cli ARGS`: the same as `hpc-serve ARGS`, with this interpreter (the gateway job runs
`python -m hpc.cli gateway D`: no console script needed on the node)."""

import sys

from hpc.cli.main import main

sys.exit(main())
