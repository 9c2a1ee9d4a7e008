"""`python -m tfdist_ext.launch -np N command...`: same as `tfdist-run`."""

import sys

from tfdist_ext.launch.cli import main

sys.exit(main())
