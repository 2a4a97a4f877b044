"""The mode-neutral trainer core: the loop (:mod:`.loop`), checkpoints, health checks, trackers, the
plot, the supervisor that restarts after a worker failure, what a run reads (:mod:`.inputs`), its
worker groups (:mod:`.worker_groups`), facts about the model (:mod:`.model_facts`) and held-out
generation (:mod:`.validation`). Every training mode is a sibling on it."""
