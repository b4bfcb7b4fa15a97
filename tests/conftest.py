"""Shared test setup: the repository root on sys.path (so `pytest` works like `python -m pytest`), and no
compiled CPU decode steps unless a test asks for them (compiling takes tens of seconds per engine)."""

from __future__ import annotations

import os
import sys
from pathlib import Path

os.environ.setdefault("TRTLLM_GATEWAY_CPU_COMPILE", "false")  # inherited by the servers tests start too

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))
