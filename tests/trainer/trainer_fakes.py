"""In-process stand-ins for the worker group views, to test the driver loop without Ray.

The "model" is one scalar weight ``w``; generation, log-probs and updates depend on it and on the
per-call seed, so a driver bug (wrong resume point, lost RNG, skipped step) changes the final ``w``.
"""

import json
import os

import torch

from hybrid_rl.protocol import DataProto

EOS = 2


class FakeActorRollout:
    def __init__(self, response_length: int = 4):
        self.w = torch.tensor(0.0, dtype=torch.float64)
        self.calls: list[str] = []
        self.response_length = response_length

    def generate_sequences(self, gen: DataProto) -> DataProto:
        self.calls.append("generate_sequences")
        g = torch.Generator().manual_seed(int(gen.meta_info["seed"]))
        b, r = len(gen), self.response_length
        # digits '0'..'9' are byte tokens 3 + 48.. in the byte tokenizer; bias them by w
        offset = int(torch.clamp(self.w * 10, -5, 5))
        responses = torch.randint(0, 10, (b, r), generator=g) + 51 + offset
        lengths = torch.randint(1, r + 1, (b,), generator=g)
        mask = (torch.arange(r)[None, :] < lengths[:, None]).long()
        responses = torch.where(mask.bool(), responses, torch.zeros_like(responses))
        responses[torch.arange(b), lengths - 1] = EOS
        return DataProto.from_dict(
            tensors={
                "prompts": gen.batch["input_ids"], "responses": responses, "response_mask": mask,
                "input_ids": torch.cat([gen.batch["input_ids"], responses], 1),
                "attention_mask": torch.cat([gen.batch["attention_mask"], mask], 1),
                "position_ids": torch.cat([gen.batch["position_ids"], gen.batch["position_ids"][:, -1:] + 1 + torch.arange(r)], 1),
            },
            meta_info={"metrics": {"rollout/fake": [1.0]}},
        )

    def compute_log_prob(self, data: DataProto) -> DataProto:
        self.calls.append("compute_log_prob")
        shape = data.batch["responses"].shape
        return DataProto.from_dict(tensors={"old_log_probs": torch.full(shape, -1.0) * (1 + self.w.float()),
                                            "entropys": torch.ones(shape)})

    def compute_ref_log_prob(self, data: DataProto) -> DataProto:
        self.calls.append("compute_ref_log_prob")
        return DataProto.from_dict(tensors={"ref_log_prob": torch.full(data.batch["responses"].shape, -1.0)})

    def update_actor(self, data: DataProto) -> DataProto:
        self.calls.append("update_actor")
        mask = data.batch["response_mask"].double()
        signal = (data.batch["advantages"].double() * data.batch["responses"].double() * mask).sum() / mask.sum()
        prompts = data.batch["prompts"].double().mean()  # which prompts were trained on matters
        self.w = self.w + 0.01 * signal + 1e-4 * prompts + 0.001 * torch.rand((), dtype=torch.float64)
        return DataProto(meta_info={"metrics": {"actor/pg_loss": [float(signal)], "actor/pg_clipfrac": [0.5],
                                                  "actor/entropy": [1.0]}})  # as the real worker

    def save_checkpoint(self, path: str, global_step: int) -> None:
        self.calls.append("save_checkpoint")
        os.makedirs(path, exist_ok=True)
        with open(os.path.join(path, "w.json"), "w") as f:
            json.dump({"w": float(self.w), "step": global_step}, f)

    def load_checkpoint(self, path: str) -> None:
        self.calls.append("load_checkpoint")
        with open(os.path.join(path, "w.json")) as f:
            self.w = torch.tensor(json.load(f)["w"], dtype=torch.float64)

    def shutdown(self) -> None:
        pass


class FakeCritic:
    def __init__(self):
        self.v = 0.0
        self.calls: list[str] = []

    def compute_values(self, data: DataProto) -> DataProto:
        self.calls.append("compute_values")
        return DataProto.from_dict(tensors={"values": torch.full(data.batch["responses"].shape, self.v)})

    def update_critic(self, data: DataProto) -> DataProto:
        self.calls.append("update_critic")
        self.v += 0.1 * float(data.batch["returns"].mean())
        return DataProto(meta_info={"metrics": {"critic/vf_loss": [1.0]}})

    def save_checkpoint(self, path: str, global_step: int) -> None:
        os.makedirs(path, exist_ok=True)
        with open(os.path.join(path, "v.json"), "w") as f:
            json.dump({"v": self.v}, f)

    def load_checkpoint(self, path: str) -> None:
        with open(os.path.join(path, "v.json")) as f:
            self.v = json.load(f)["v"]


class FakePool:
    def remove(self) -> None:
        pass
