"""Supervised fine-tuning, a mode on the trainer core: :class:`~hybrid_rl.trainer.sft.trainer.SFTTrainer`
(:mod:`.trainer`), configured by :class:`~hybrid_rl.trainer.config.supervised.SFTConfig` (``main_sft``)."""
