"""Model-zoo accuracy sweep; the same flags as `relay-amp sweep` (see --help)."""

import sys

from relay_amp.cli import main

if __name__ == "__main__":
    sys.exit(main(["sweep", *sys.argv[1:]]))
