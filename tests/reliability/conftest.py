"""tests/reliability: reuse the trainer tests' fakes and end-to-end CLI helpers (tests/trainer)."""

import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "trainer"))
