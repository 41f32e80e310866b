"""``python -m relay_amp.cli`` is ``relay-amp``."""

import sys

from . import main

sys.exit(main())
