"""`python -m gateway ...` behaves like the `trtllm-gateway` console script."""

import sys

from gateway.cli import main

sys.exit(main())
