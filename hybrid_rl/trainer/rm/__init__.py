"""Reward-model training, a mode on the trainer core: :class:`~hybrid_rl.trainer.rm.trainer.RMTrainer`
(:mod:`.trainer`), configured by :class:`~hybrid_rl.trainer.config.supervised.RMConfig` (``main_rm``)."""
