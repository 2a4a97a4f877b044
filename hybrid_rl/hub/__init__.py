"""Environments and tasks from hubs, loaded unchanged (issue 57 item 3).

Each module adapts one library to the house's plugin points without editing the library's tasks:
``reasoning_gym`` (procedural tasks as data and their own scoring as the reward) and ``textarena``
(multi-turn games as :class:`hybrid_rl.agents.env.BaseTextEnv` environments). Both are optional
(``pip install -e .[envs]``); importing this package imports neither library.
"""
