"""Timing for the scorer tests that must survive a slow, heavily loaded CI machine.

An item that must succeed gets a per-item budget no scheduler stall can exhaust (``BUDGET_S``), and
one that must time out hangs far longer (``HANG_S``, cut short by ``RELEASE`` when its test ends:
``tests/reward/conftest.py``), so "it did not wait for the hang" is ``elapsed < HANG_S / 2``, never a
tight margin.
"""

import threading

BUDGET_S = 10.0
HANG_S = 120.0
RELEASE = threading.Event()
"""Set at the end of each test: the thread-mode scorers hung on it return (at most 4 may stay hung)."""
