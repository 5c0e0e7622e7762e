"""`python -m mop ...` runs the `mop` command."""

from mop.cli import main

raise SystemExit(main())
