"""The PPO-family mode: :class:`~hybrid_rl.trainer.ppo.trainer.RayPPOTrainer` (:mod:`.trainer`), its
decoupled variant (:mod:`.decoupled` with the rollout :mod:`.producer`), the driver-side batch
operations (:mod:`.ops`), the learned reward model in RL (:mod:`.learned_reward`) and the checks that
need the built datasets (:mod:`.preflight`)."""
