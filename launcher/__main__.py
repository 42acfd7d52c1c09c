"""``python -m launcher DIR``."""

import sys

from launcher.node.run import main

if __name__ == "__main__":
    sys.exit(main())
