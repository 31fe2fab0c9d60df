"""``python -m mergetxn.cli``: the ``mergetxn`` command."""

from mergetxn.cli import main

main()
