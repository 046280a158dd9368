"""``python -m axoexp``: :func:`axoexp.cli.main`; Ctrl-C while its modules import is one line too."""

from axoexp.signals import run_command

run_command("axoexp", "axoexp.cli", runs=True)
