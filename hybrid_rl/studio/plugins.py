"""User plugin files for the studio: imported before the form is built, and before a launched run.

A plugin file registers entries as a notebook would (``@register_adv_est("my_est")``,
``@register_policy_loss``, ``@register_reward``, tools): importing it is all it takes, so its names
appear among the choices. A run launched from the studio starts through :mod:`hybrid_rl.studio.run_with_plugins`,
which imports the same files in the run's process before ``main_ppo`` reads its config. Entries
that run inside Ray workers (a policy loss in a multi-worker run) need the file importable there too:
the default one-process CPU run has none.
"""

from __future__ import annotations

import importlib.util
import os
import sys
from types import ModuleType


def load_plugin_files(paths: list[str]) -> list[ModuleType]:
    """Import each file (as ``hybrid_rl_plugin_<stem>``); a missing or failing file is one line."""
    modules = []
    for path in paths:
        full = os.path.abspath(os.path.expanduser(path))
        if not os.path.isfile(full):
            raise ValueError(f"plugin file {path!r} does not exist; give the path of a .py file that registers "
                             "entries (e.g. with @register_adv_est)")
        name = "hybrid_rl_plugin_" + os.path.splitext(os.path.basename(full))[0]
        if name in sys.modules and getattr(sys.modules[name], "__file__", None) == full:
            modules.append(sys.modules[name])  # imported already: registering twice would be refused
            continue
        spec = importlib.util.spec_from_file_location(name, full)
        module = importlib.util.module_from_spec(spec)
        try:
            spec.loader.exec_module(module)
        except Exception as error:  # noqa: BLE001 (any failure of user code becomes one line)
            raise ValueError(f"plugin file {path!r} failed to import: {type(error).__name__}: {error}") from None
        sys.modules[name] = module
        modules.append(module)
    return modules
