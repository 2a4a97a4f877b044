"""Tools written against veRL's interface load and run: duck typing, call shapes, schema objects,
``ToolResponse`` results, and veRL's own ``gsm8k_tool_config.yaml`` with its ``Gsm8kTool``."""

import asyncio
from pathlib import Path
from typing import Any, Optional
from uuid import uuid4

import pytest

from hybrid_rl.agents import MultiTurnConfig, OpenAIFunctionToolSchema, RowContext, ToolResponse, load_tools
from hybrid_rl.agents.loop import AgentLoop
from hybrid_rl.agents.tool import call_create
from hybrid_rl.utils.testing import build_byte_tokenizer

REPO = Path(__file__).resolve().parents[2]
VERL_YAML = REPO / "recipes" / "gsm8k_verl_tool" / "gsm8k_tool_config.yaml"
EOS = 2


class VerlStyleLookup:
    """Written the way a veRL tool is (its own base-less class here, as a veRL tool subclasses veRL's
    BaseTool, not ours): schema read by attribute, ``create_kwargs=`` read from kwargs, ToolResponse out."""

    def __init__(self, config: dict, tool_schema: OpenAIFunctionToolSchema):
        self.config = config
        self.tool_schema = tool_schema
        self.name = self.tool_schema.function.name
        self._instance_dict = {}

    async def create(self, instance_id: Optional[str] = None, **kwargs) -> tuple[str, ToolResponse]:
        instance_id = instance_id or str(uuid4())
        self._instance_dict[instance_id] = kwargs.get("create_kwargs", {}).get("table", {})
        return instance_id, ToolResponse()

    async def execute(self, instance_id: str, parameters: dict[str, Any], **kwargs) -> tuple[ToolResponse, float, dict]:
        value = self._instance_dict[instance_id].get(parameters.get("key"), "missing")
        return ToolResponse(text=f"value={value}"), 0.0, {}

    async def release(self, instance_id: str, **kwargs) -> None:
        del self._instance_dict[instance_id]


@pytest.fixture(scope="module")
def tok():
    return build_byte_tokenizer()


def ids(tok, text, eos=True):
    return tok(text, add_special_tokens=False)["input_ids"] + ([EOS] if eos else [])


def scripted(tok, turns):
    """An engine that answers the k-th turn of every row with turns[k]."""
    def generate(token_lists, max_tokens, turn):
        return [(ids(tok, turns[turn])[:limit], [-0.25] * len(ids(tok, turns[turn])[:limit]))
                for limit in max_tokens]
    return generate


def run_loop(tok, tools, rows, turns, **cfg):
    loop = AgentLoop(MultiTurnConfig(enable=True, **cfg), tok, tools, {}, [EOS])
    prompts = [ids(tok, "Q:", eos=False) for _ in rows]
    return loop.run(prompts, rows, scripted(tok, turns), budget=1000)


def observation_text(tok, traj):
    return tok.decode([t for t, m in zip(traj.response_ids, traj.response_mask) if m == 0])


def test_verl_gsm8k_yaml_runs_unchanged_with_observations_masked(tok):
    tools = load_tools(str(VERL_YAML))
    assert list(tools) == ["calc_gsm8k_reward"]
    tool = tools["calc_gsm8k_reward"]
    assert type(tool).__module__ == "hybrid_rl.agents.gsm8k_tool"  # veRL's class path, resolved to the port
    assert tool.tool_schema.function.parameters.required == ["answer"]
    call = '<tool_call>{"name": "calc_gsm8k_reward", "arguments": {"answer": "%s"}}</tool_call>'
    rows = [RowContext(tools_kwargs={"calc_gsm8k_reward": {"create_kwargs": {"ground_truth": "72"}}})]
    (traj,) = run_loop(tok, tools, rows, [call % "70", call % "72", "#### 72"], max_parallel_calls=1)
    obs = observation_text(tok, traj)
    assert "answer='70' reward=0.0" in obs and "answer='72' reward=1.0" in obs
    # sampled turns carry mask 1 and their log-probs; observation tokens mask 0 and log-prob 0
    model_ids = [t for t, m in zip(traj.response_ids, traj.response_mask) if m == 1]
    assert model_ids == ids(tok, call % "70") + ids(tok, call % "72") + ids(tok, "#### 72")
    assert all(lp == (-0.25 if m else 0.0) for lp, m in zip(traj.log_probs, traj.response_mask))
    assert traj.end_reason == "stop" and traj.tool_calls == 2 and traj.tool_errors == 0
    # step rewards: no improvement (-0.05), improvement (0.0); then calc_reward of the last answer (1.0)
    assert traj.tool_rewards == [-0.05, 0.0, 1.0]
    assert traj.tool_metrics == {"tool/calc_gsm8k_reward/correct": 1.0}


def test_duck_typed_verl_tool_gets_schema_object_and_create_kwargs(tok, tmp_path):
    path = tmp_path / "tools.yaml"
    path.write_text(f"""tools:
  - class_name: {__name__}.VerlStyleLookup
    config: {{type: native}}
    tool_schema:
      type: function
      function:
        name: lookup
        description: look a key up
        parameters: {{type: object, properties: {{key: {{type: string, description: the key}}}}, required: [key]}}
""")
    tools = load_tools(str(path))
    assert isinstance(tools["lookup"].tool_schema, OpenAIFunctionToolSchema)
    call = '<tool_call>{"name": "lookup", "arguments": {"key": "a"}}</tool_call>'
    rows = [RowContext(tools_kwargs={"lookup": {"create_kwargs": {"table": {"a": 7}}}})]
    (traj,) = run_loop(tok, tools, rows, [call, "done"])
    assert "value=7" in observation_text(tok, traj) and traj.tool_errors == 0
    assert tools["lookup"]._instance_dict == {}  # released at the end of the trajectory


class _Shapes:
    async def by_name(self, instance_id=None, ground_truth=None):
        return "a", ("by_name", ground_truth)

    async def verl_shape(self, instance_id=None, create_kwargs=None):
        return "b", ("verl_shape", create_kwargs)

    async def open_kwargs(self, instance_id=None, **kwargs):
        return "c", ("open_kwargs", kwargs)


@pytest.mark.parametrize("method, expected", [
    ("by_name", ("by_name", "72")),
    ("verl_shape", ("verl_shape", {"ground_truth": "72", "extra": 1})),
    ("open_kwargs", ("open_kwargs", {"ground_truth": "72", "extra": 1,
                                     "create_kwargs": {"ground_truth": "72", "extra": 1}})),
])
def test_create_is_called_in_the_shape_its_signature_takes(method, expected):
    tool = type("T", (), {"create": getattr(_Shapes, method)})()
    _, got = asyncio.run(call_create(tool, {"ground_truth": "72", "extra": 1}))
    assert got == expected


class _Media:
    """Returns a veRL-shaped response carrying an image, or a foreign object with a text attribute."""

    def __init__(self, config=None, tool_schema=None):
        self.tool_schema = {"type": "function", "function": {"name": "media"}}
        self.image = True

    async def execute(self, instance_id, parameters, **kwargs):
        if self.image:
            return ToolResponse(text="see", image=["<img>"]), 0.0, {}
        return type("Foreign", (), {"text": "plain text", "image": None, "video": None})(), 0.0, {}


def test_image_results_are_refused_in_one_line_and_foreign_text_responses_work(tok, tmp_path):
    path = tmp_path / "media.yaml"
    path.write_text(f"tools:\n  - class_name: {__name__}._Media\n    config: {{type: native}}\n")
    tools = load_tools(str(path))
    call = '<tool_call>{"name": "media", "arguments": {}}</tool_call>'
    (traj,) = run_loop(tok, tools, [RowContext()], [call, "done"])
    obs = observation_text(tok, traj)
    assert "returned image content, which hybrid_rl's text-only rollout cannot show" in obs and traj.tool_errors == 1
    tools["media"].image = False
    (traj,) = run_loop(tok, tools, [RowContext()], [call, "done"])
    assert "plain text" in observation_text(tok, traj) and traj.tool_errors == 0


def test_a_class_without_execute_is_refused_in_one_line(tmp_path):
    path = tmp_path / "bad.yaml"
    path.write_text("tools:\n  - class_name: collections.OrderedDict\n    config: {type: native}\n")
    with pytest.raises(ValueError, match=r"tools\[0\]: 'collections.OrderedDict' is neither a BaseTool subclass "
                                         r"nor a class with an async execute\(\)"):
        load_tools(str(path))
