"""`python -m raftlog.chaos run ...` (the same as `raftlog chaos run ...`)."""

import sys

from raftlog.chaos.cli import main

sys.exit(main())
