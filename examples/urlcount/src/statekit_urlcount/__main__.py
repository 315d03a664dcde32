"""``python -m statekit_urlcount``: the same as the ``statekit-urlcount`` command."""

import sys

from ._cli import main

sys.exit(main())
