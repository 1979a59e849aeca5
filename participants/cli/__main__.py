"""``python -m ckpt_events.participants.cli``: the command line, as the ``ckpt-events`` script runs it.

The fleet starts its servers this way: ``-m ckpt_events.participants.cli.main`` imported ``main`` twice
(once through the package), and every server's stderr began with runpy's RuntimeWarning.
"""

import sys

from ckpt_events.participants.cli.main import main

if __name__ == "__main__":  # imported (the layout test imports every module), it runs nothing
    sys.exit(main())
