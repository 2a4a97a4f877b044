"""ppo_role_batching: the Learner keywords the actor and critic sections set under veRL's names."""

from types import SimpleNamespace

from hybrid_rl.workers.learner import ppo_role_batching

SECTION = SimpleNamespace(ppo_micro_batch_size_per_gpu=4, use_dynamic_bsz=True, ppo_max_token_len_per_gpu=2048,
                          grad_clip=1.0, use_prefix_grouper=False)


def test_the_section_names_every_keyword_and_the_role_names_the_token_budget_key():
    assert ppo_role_batching(SECTION, "critic") == {
        "micro_batch_rows": 4, "use_dynamic_bsz": True, "max_token_len": 2048,
        "max_token_len_key": "critic.ppo_max_token_len_per_gpu", "grad_clip": 1.0, "use_prefix_grouper": False,
        "role": "critic"}


def test_this_ranks_micro_batch_rows_win_over_the_sections():
    assert ppo_role_batching(SECTION, "actor", 2)["micro_batch_rows"] == 2
    assert ppo_role_batching(SECTION, "actor", None)["micro_batch_rows"] == 4
