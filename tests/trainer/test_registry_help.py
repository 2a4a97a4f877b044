"""--help's registry listing names every registry, its key and every entry with its description."""

from hybrid_rl.trainer.registry_help import entry_line, registry_help, registry_notes
from hybrid_rl.utils.registry import EntryInfo, all_registries


def test_the_block_lists_every_registry_and_every_entry():
    text = registry_help()
    registries = all_registries()
    kinds = {r.kind for r in registries}
    assert {"advantage estimator", "policy loss", "distillation loss", "objective", "reward function",
            "reward manager", "tool", "interaction", "environment", "agent loop", "tool-call format",
            "rollout engine"} <= kinds
    for registry in registries:
        assert f"  {registry.kind} ({registry.config_key}):\n" in text
        for name, info in registry.describe().items():
            assert f"    {entry_line(name, info)}\n" in text
    assert "    grpo [needs groups]: GRPO outcome advantage" in text
    assert "    vllm [runs on cpu, cuda, falls back to hf]: " in text
    assert "    calculator: " in text and "    naive: " in text and "    hermes: " in text
    assert "    tool_agent: Built in: " in text  # the built-in agent loops are entries too


def test_notes_sit_under_each_key_and_alias():
    notes = registry_notes()
    assert "grpo [needs groups]: GRPO outcome advantage: one scalar per response, normalised within its prompt " \
           "group." in notes["algorithm.adv_estimator"]
    assert notes["actor_rollout_ref.actor.policy_loss.loss_mode"] == notes["actor.policy_loss.loss_mode"]
    assert sorted(line.split(":")[0] for line in notes["actor_rollout_ref.rollout.name"]) == [
        "hf", "vllm [runs on cpu, cuda, falls back to hf]"]


def test_entry_line_formats():
    assert entry_line("a", EntryInfo("Does a.")) == "a: Does a."
    assert entry_line("b", EntryInfo("")) == "b"
    assert entry_line("c", object()) == "c"
