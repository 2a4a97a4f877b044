"""``RayClassWithInitArgs``: a worker class and its constructor arguments, the unit every worker group
builds from. Free of Ray at import, so a one-process run
(:class:`~hybrid_rl.single_controller.local.LocalWorkerGroup`) needs no Ray installed; Ray is
imported only when an actor is started."""

from __future__ import annotations

from typing import Any

from hybrid_rl.single_controller.worker import Worker

__all__ = ["RayClassWithInitArgs"]


class RayClassWithInitArgs:
    """A Worker class plus the arguments its constructor gets in every actor (veRL's name and signature).

    ``cls`` may be the plain class or ``ray.remote(cls)``. Extra Ray actor options (e.g. ``runtime_env``)
    can be added with :meth:`update_options`.
    """

    def __init__(self, cls: Any, *args: Any, **kwargs: Any):
        self.raw_cls: type = getattr(cls, "__ray_actor_class__", cls)
        if not (isinstance(self.raw_cls, type) and issubclass(self.raw_cls, Worker)):
            raise TypeError(f"RayClassWithInitArgs needs a subclass of hybrid_rl Worker, got {cls!r}")
        self.args = args
        self.kwargs = kwargs
        self.options: dict[str, Any] = {}

    @property
    def cls(self) -> type:
        """The plain worker class."""
        return self.raw_cls

    def update_options(self, options: dict[str, Any]) -> None:
        """Merge extra ``ray.remote`` actor options (applied to every actor of the group)."""
        self.options.update(options)

    def create_actor(self, bundle: Any, resources: dict[str, float],
                     env_vars: dict[str, str], name: str) -> Any:
        """Start one actor in ``bundle`` with ``env_vars`` added to its environment."""
        import ray

        options = dict(self.options)
        runtime_env = dict(options.pop("runtime_env", {}) or {})
        runtime_env["env_vars"] = {**runtime_env.get("env_vars", {}), **env_vars}
        actor_cls = ray.remote(self.raw_cls)
        return actor_cls.options(
            name=name, scheduling_strategy=bundle, runtime_env=runtime_env, max_restarts=0,
            **resources, **options,
        ).remote(*self.args, **self.kwargs)
