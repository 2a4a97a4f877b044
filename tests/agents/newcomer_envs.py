"""An environment registered by name in a module nothing imports (tests/agents/test_newcomer_friction.py)."""

from hybrid_rl.agents import BaseTextEnv, register_env


@register_env("newcomer_echo")
class Echo(BaseTextEnv):
    """Reward 1 per step, never ends on its own; counts its ``step()`` calls."""

    def reset(self, seed=None, options=None):
        return "say something", {}

    def step(self, action):
        return "obs", 1.0, False, False, {}
