"""What each named step of a training step reads from the batch and writes into it.

A mode declares a :class:`BatchPlan`: the keys its dataset's collate puts in a fresh batch
(:attr:`BatchPlan.inputs`) and one :class:`StepContract` per step, in the order the steps run when
every one of them is due (the update after a warm-up included). Names are those of
:data:`hybrid_rl.schema.BATCH_SCHEMA`.

* At start-up (:meth:`BatchPlan.check`, called by the trainer core before any worker starts) a plan
  in which a step reads a key that neither the dataset nor an earlier step writes is refused in one
  line naming the step, the key, the plan and what would produce the key.
* With ``trainer.check_batch=true`` (or ``HYBRID_RL_CHECK_BATCH=1``, which the test suite sets) the
  core checks the batch before each step against what it reads and after it against what it
  writes, and refuses a key the schema does not know (:func:`check_before`, :func:`check_after`).
  The checks cost microseconds per step (set operations over a few dozen names).

The cadence steps (``validate``, ``save_checkpoint``) read and write nothing (:data:`CADENCE`).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Optional

from hybrid_rl.protocol import DataProto
from hybrid_rl.schema import check_batch, lookup, unknown_keys

__all__ = ["BatchPlan", "CADENCE", "CHECK_BATCH_ENV", "StepContract", "check_after", "check_before",
           "check_batch_enabled"]

CHECK_BATCH_ENV = "HYBRID_RL_CHECK_BATCH"
"""Set to 1 to check every step's batch whatever ``trainer.check_batch`` says (tests/conftest.py does)."""


@dataclass(frozen=True)
class StepContract:
    """The batch keys one named step reads and writes."""

    name: str
    """The step method's name (``compute_advantage``)."""
    reads: tuple[str, ...] = ()
    """Keys the step cannot run without: present before it runs."""
    optional_reads: tuple[str, ...] = ()
    """Keys the step uses when present (never required, never checked for)."""
    writes: tuple[str, ...] = ()
    """Keys the step always leaves in the batch (a key it writes only sometimes is not listed)."""


CADENCE: tuple[StepContract, ...] = (StepContract("validate"), StepContract("save_checkpoint"))
"""The tail of every step plan (:meth:`TrainerCore.cadence_steps`): no batch keys."""


@dataclass(frozen=True)
class BatchPlan:
    """A mode's declaration: what a fresh batch holds and each step's contract, in running order."""

    inputs: StepContract
    """What the batch holds before the first step (its ``writes``), e.g. the dataset's collate."""
    steps: tuple[StepContract, ...]
    """Every step a training step may run, in order, the cadence excluded."""
    owner: str = "the mode"
    """Where the declarations live, for messages (``hybrid_rl/trainer/ppo/contracts.py``)."""
    _by_name: dict = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "_by_name", {c.name: c for c in self.steps + CADENCE})

    def contract(self, name: str) -> Optional[StepContract]:
        """The contract of step ``name`` (None if the plan does not declare it)."""
        return self._by_name.get(name)

    def check(self) -> None:
        """ValueError (one line) unless every declared key is in the schema and each step's reads are
        written by the dataset or an earlier step."""
        for contract in (self.inputs,) + self.steps:
            for name in contract.reads + contract.optional_reads + contract.writes:
                if lookup(name) is None:
                    raise ValueError(f"step {contract.name} declares batch key {name!r}, which is not in the batch "
                                     f"schema (hybrid_rl/schema.py). Fix: spell it as the schema does or add it there "
                                     f"(declared in {self.owner})")
        made = {name: self.inputs.name for name in self.inputs.writes}
        for contract in self.steps:
            for name in contract.reads:
                if name not in made:
                    raise ValueError(self._unproduced(contract.name, name))
            made.update({name: contract.name for name in contract.writes})

    def _unproduced(self, step: str, name: str) -> str:
        plan = " -> ".join(c.name for c in self.steps)
        later = [c.name for c in self.steps[self.steps.index(self.contract(step)) + 1:] if name in c.writes]
        hint = (f"{later[0]} writes it but runs later" if later else
                f"the schema says it comes from: {lookup(name).produced_by}")
        return (f"step {step} needs batch key {name!r} that no earlier step produces (steps: {plan}; "
                f"{self.inputs.name} writes {sorted(self.inputs.writes)}). Fix: enable the setting that runs the "
                f"step producing it ({hint}) or drop what needs it (declared in {self.owner})")


def check_batch_enabled(setting: bool) -> bool:
    """``trainer.check_batch``, or the environment's ``HYBRID_RL_CHECK_BATCH=1``."""
    return bool(setting) or os.environ.get(CHECK_BATCH_ENV) == "1"


def check_before(plan: BatchPlan, name: str, batch: DataProto) -> None:
    """ValueError unless the batch holds what step ``name`` reads (a step the plan lacks is an error)."""
    contract = plan.contract(name)
    if contract is None:
        raise ValueError(f"step {name} has no batch contract, and trainer.check_batch is on. Fix: declare it "
                         f"(a StepContract in {plan.owner}, or the mode's declare_batch_plan) or set "
                         f"trainer.check_batch=false with {CHECK_BATCH_ENV} unset")
    check_batch(batch, contract.reads, step=name)


def check_after(plan: BatchPlan, name: str, batch: DataProto) -> None:
    """ValueError unless the batch holds what step ``name`` writes and only keys the schema knows."""
    check_batch(batch, plan.contract(name).writes, step=name)
    unknown = unknown_keys(batch)
    if unknown:
        raise ValueError(f"step {name}: the batch holds {unknown}, not in the batch schema (hybrid_rl/schema.py). "
                         "Fix: spell the key as the schema does, or add it there")
