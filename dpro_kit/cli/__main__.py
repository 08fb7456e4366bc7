"""``python -m dpro_kit.cli ...``: the ``dpro`` command."""
import sys

from . import main

sys.exit(main())
