"""The one registry implementation: duplicates, unknown names, replace policies, the live name view,
and every family of the package sitting on it."""

import pytest

from hybrid_rl.utils.registry import (EntryInfo, Registry, all_registries, first_doc_line, same_definition,
                                      same_object)


def _made_twice():
    """Two functions with the same module and qualified name (a re-run notebook cell)."""
    def score():
        """Scores."""
    first = score

    def score():  # noqa: F811 - redefined on purpose
        """Scores again."""
    return first, score


def test_duplicates_raise_one_line_naming_both_definitions():
    registry = Registry("thing", "x.thing", listed=False)

    @registry.register("a")
    def one():
        """The first one. More text."""

    def two():
        pass

    with pytest.raises(ValueError) as error:
        registry.register("a")(two)
    message = str(error.value)
    assert "\n" not in message and message.startswith("thing 'a' is already registered (by ")
    assert "one" in message and "two" in message
    assert registry.info("a") == EntryInfo(description="The first one.")  # default: first docstring sentence


def test_unknown_names_list_the_registered_ones_and_the_key():
    registry = Registry("thing", "x.thing", listed=False)
    registry.add("b", object(), EntryInfo("bee"))
    registry.add("a", object(), EntryInfo("ay"))
    with pytest.raises(ValueError, match=r"^unknown thing 'c' \(x\.thing\); registered: \['a', 'b'\]\. Set x\.thing"):
        registry.get("c")
    custom = Registry("thing", "x.thing", listed=False, unknown_error=lambda name, names: f"no {name}; try {names}")
    custom.add("a", object())
    with pytest.raises(ValueError, match=r"^no z; try \['a'\]$"):
        custom.info("z")
    assert registry.find("c") is None and registry.descriptions() == {"a": "ay", "b": "bee"}


def test_replace_policies():
    first, again = _made_twice()
    strict = Registry("s", "k", listed=False)
    strict.add("f", first)
    with pytest.raises(ValueError):
        strict.add("f", first)  # no policy: even the same object raises (the algorithm families)
    by_object = Registry("o", "k", may_replace=same_object, listed=False)
    by_object.add("f", first)
    by_object.add("f", first)
    with pytest.raises(ValueError):
        by_object.add("f", again)
    by_definition = Registry("d", "k", may_replace=same_definition, listed=False)
    by_definition.add("f", first)
    by_definition.add("f", again)  # the cell run again replaces it
    assert by_definition.get("f") is again
    by_definition.add("f", len, force=True)
    assert by_definition.get("f") is len
    assert not same_definition(lambda: 0, len)


def test_name_view_follows_registrations_in_order_and_prints_as_a_tuple():
    registry = Registry("engine", "e.name", listed=False)
    view = registry.name_view()
    registry.add("vllm", object())
    registry.add("hf", object())
    assert repr(view) == "('vllm', 'hf')" and tuple(view) == ("vllm", "hf") and view == ("vllm", "hf")
    assert "hf" in view and "x" not in view and len(view) == 2 and view[0] == "vllm"
    registry.add("fake", object())
    assert tuple(view) == ("vllm", "hf", "fake")
    registry.unregister("fake")
    assert registry.names() == ["hf", "vllm"]  # names() is sorted
    entries = registry.entry_view()
    registry.add("late", len)
    assert entries["late"] is len and list(entries) == ["vllm", "hf", "late"]
    with pytest.raises(TypeError):
        entries["x"] = len  # read-only


def test_copy_is_unlisted_and_independent():
    registry = Registry("thing", "x.thing")
    try:
        registry.add("a", object())
        clone = registry.copy()
        clone.add("b", object())
        assert registry.names() == ["a"] and clone.names() == ["a", "b"]
        assert registry in all_registries() and clone not in all_registries()
    finally:
        from hybrid_rl.utils import registry as module

        module._ALL.remove(registry)  # leave no test registry in --help


def test_every_family_sits_on_the_one_registry():
    import hybrid_rl.agents  # noqa: F401 - tools, interactions, environments, agent loops
    import hybrid_rl.algorithms.distillation  # noqa: F401 - estimators, policy losses, distillation losses
    import hybrid_rl.reward  # noqa: F401 - scorers, managers
    import hybrid_rl.workers.rollout  # noqa: F401 - engines

    kinds = {r.kind for r in all_registries()}
    assert {"advantage estimator", "policy loss", "distillation loss", "reward function", "reward manager",
            "tool", "interaction", "environment", "agent loop", "rollout engine"} <= kinds


def test_first_doc_line_keeps_abbreviations():
    def fn():
        """GRPO (Shao et al. 2024), i.e. group baselines. Second sentence."""
    assert first_doc_line(fn) == "GRPO (Shao et al. 2024), i.e. group baselines."
