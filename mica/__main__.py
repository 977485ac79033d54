"""`python -m mica ...`: the `mica` command."""
import sys

from .cli import main

sys.exit(main())
