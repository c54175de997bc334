"""``python -m controlplane.cli``: the ``subagent-control`` command without its script."""

import sys

from controlplane.cli._main import main

sys.exit(main())
