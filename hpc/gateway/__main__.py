"""`python -m hpc.gateway TARGET [--host H] [--port P]`: the same as `hpc-serve gateway`."""

import sys

from hpc.cli import main

sys.exit(main(["gateway", *sys.argv[1:]]))
