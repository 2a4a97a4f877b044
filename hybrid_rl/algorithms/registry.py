"""The name -> entry registry of the algorithm families (estimators, losses, objectives).

It is the package's one registry implementation, :mod:`hybrid_rl.utils.registry`; this module keeps
the import path the algorithm families and user code have used.
"""

from __future__ import annotations

from hybrid_rl.utils.registry import EntryInfo, Registry, all_registries, first_doc_line

__all__ = ["EntryInfo", "Registry", "all_registries", "first_doc_line"]
