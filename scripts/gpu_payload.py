"""Gather what the bare GPU machine lacks for ``benchmarks/gpu_check.py`` into one ignored folder.

    python scripts/gpu_payload.py            # from the project root: writes .gpu_payload/ (~7 MiB)
    python scripts/gpu_payload.py --check    # only the size check: the tree + the payload <= 60 MiB

The device machine (docs/gpu.md) has Python 3.12 with CUDA torch, transformers, accelerate, peft,
pandas, pyarrow, psutil and pytest, and nothing can be fetched there. The check runs without Ray or
vLLM (one process, HF rollout: ``trainer.single_process``), so what it lacks is small:

* :data:`WHEELS`: cp312 wheels (pure Python except ``pydantic-core``), downloaded here with ``pip
  download --no-deps`` for manylinux x86-64 and pinned, so that each name has exactly one version;
  ``antlr4-python3-runtime`` 4.9.3 (omegaconf's parser) has no wheel on the index and is built here;
* ``tokenizer/``: SmolLM2's tokenizer, saved from the embedded model: the check random-initialises
  its models from their shapes, so no model wheel travels.

Everything the device tool carries (the working tree's tracked and untracked-not-ignored files, plus
the carried folder) must fit one transfer of 64 MiB; this script fails above :data:`LIMIT_MIB`.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
PAYLOAD = REPO / ".gpu_payload"
LIMIT_MIB = 60.0
"""The tree plus the payload must stay under this (the device tool's transfer limit is 64 MiB)."""
WHEELS = {
    # the project's own imports on the one-process path
    "hydra-core": "1.3.2", "omegaconf": "2.3.0", "tensordict": "0.15.3", "pyvers": "0.2.3", "codetiming": "1.4.0",
    "pydantic": "2.14.4", "pydantic-core": "2.50.5", "annotated-types": "0.8.0", "typing-inspection": "0.4.5",
    "typing-extensions": "4.16.0",
    # TRL's GRPOTrainer for the side-by-side
    "trl": "1.16.0", "datasets": "5.2.0", "dill": "0.4.1", "multiprocess": "0.70.19",
}
BUILT = {"antlr4-python3-runtime": "4.9.3"}
"""Pure-Python packages with no wheel on the index: built here with ``pip wheel``."""
PLATFORM = ["--only-binary=:all:", "--python-version", "3.12", "--implementation", "cp",
            *[a for p in ("manylinux_2_28_x86_64", "manylinux_2_27_x86_64", "manylinux_2_17_x86_64",
                          "manylinux2014_x86_64", "manylinux1_x86_64", "any") for a in ("--platform", p)]]


def tree_files(repo: Path = REPO) -> list[Path]:
    """The files the device tool sends: tracked ones and untracked ones git does not ignore."""
    listed = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=repo,
                            capture_output=True, check=True).stdout.decode()
    return [repo / name for name in listed.split("\0") if name and (repo / name).is_file()]


def folder_bytes(folder: Path) -> int:
    """Bytes of every file under ``folder`` (0 when it does not exist)."""
    return sum(p.stat().st_size for p in folder.rglob("*") if p.is_file()) if folder.is_dir() else 0


def transfer_mib(repo: Path = REPO, payload: Path = PAYLOAD) -> tuple[float, float]:
    """``(tree MiB, payload MiB)``: what one device call carries."""
    return sum(p.stat().st_size for p in tree_files(repo)) / 2**20, folder_bytes(payload) / 2**20


def check_size(repo: Path = REPO, payload: Path = PAYLOAD, limit_mib: float = LIMIT_MIB) -> str:
    """One line with both sizes; ``ValueError`` when together they exceed ``limit_mib``."""
    tree, extra = transfer_mib(repo, payload)
    line = f"working tree {tree:.1f} MiB + {payload.name} {extra:.1f} MiB = {tree + extra:.1f} MiB (limit {limit_mib:.0f})"
    if tree + extra > limit_mib:
        raise ValueError(f"{line}: too large for one device transfer; drop wheels from scripts/gpu_payload.py "
                         "WHEELS or untracked files from the tree.")
    return line


def download_wheels(dest: Path) -> None:
    """:data:`WHEELS` (as cp312 manylinux wheels) and :data:`BUILT` into ``dest``."""
    pip = [sys.executable, "-m", "pip"]
    pins = [f"{name}=={version}" for name, version in WHEELS.items()]
    subprocess.run([*pip, "download", "-q", "--no-deps", *PLATFORM, "-d", str(dest), *pins], check=True)
    built = [f"{name}=={version}" for name, version in BUILT.items()]
    subprocess.run([*pip, "wheel", "-q", "--no-deps", "-w", str(dest), *built], check=True)


def save_tokenizer(dest: Path) -> None:
    """SmolLM2's tokenizer (from the embedded model) into ``dest``."""
    from hybrid_rl.workers.model_loader import load_tokenizer, resolve_model_path

    load_tokenizer(resolve_model_path("HuggingFaceTB/SmolLM2-135M-Instruct")).save_pretrained(str(dest))


def build(payload: Path = PAYLOAD) -> None:
    """Write the payload afresh into ``payload`` (a temporary sibling renamed at the end)."""
    tmp = payload.with_name(payload.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    download_wheels(tmp / "whl")
    save_tokenizer(tmp / "tokenizer")
    shutil.rmtree(payload, ignore_errors=True)
    os.rename(tmp, payload)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="only check the size of the tree and the payload")
    args = parser.parse_args(argv)
    if not args.check:
        build()
        wheels = sorted(p.name for p in (PAYLOAD / "whl").glob("*.whl"))
        print(f"{len(wheels)} wheels and the tokenizer in {PAYLOAD}:\n  " + "\n  ".join(wheels))
    try:
        print(check_size())
    except ValueError as e:
        print(e, file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
