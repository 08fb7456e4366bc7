"""``python -m dpro_kit ...``: the ``dpro`` command."""
import sys

from .cli import main

sys.exit(main())
