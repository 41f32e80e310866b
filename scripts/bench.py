"""Benchmarks vs TVM's built-in pass; the same flags as `relay-amp bench` (see --help)."""

import sys

from relay_amp.cli import main

if __name__ == "__main__":
    sys.exit(main(["bench", *sys.argv[1:]]))
