"""``python -m axoexp``: :func:`axoexp.cli.main`; Ctrl-C while its modules import is one line too."""

import sys

from axoexp.signals import OUTSIDE_A_RUN, OUTSIDE_A_RUN_EXIT

try:
    from axoexp.cli import main
except KeyboardInterrupt:
    print(f"axoexp: {OUTSIDE_A_RUN}", file=sys.stderr)
    sys.exit(OUTSIDE_A_RUN_EXIT)
main()
