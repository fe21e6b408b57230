"""`python -m raftlog ...` is the `raftlog` command."""

import sys

from raftlog.cli import main

sys.exit(main())
