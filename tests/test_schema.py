"""The batch schema table: consistent with docs/architecture.md and check_batch errors."""

import re
from pathlib import Path

import pytest
import torch

from hybrid_rl.protocol import DataProto
from hybrid_rl.schema import BATCH_SCHEMA, SCHEMA_BY_NAME, check_batch, keys_produced_by

DOC = Path(__file__).resolve().parents[1] / "docs" / "architecture.md"


def _doc_keys() -> dict[str, set[str]]:
    """Keys per part as listed in the schema section of the architecture doc."""
    section = DOC.read_text().split("## The batch schema", 1)[1].split("\n## ", 1)[0]
    table_cells = [line.split("|")[1] for line in section.splitlines() if line.startswith("| `")]
    prose = " ".join(line for line in section.splitlines() if not line.startswith("|"))
    non_tensor_text = prose.split("Non-tensor", 1)[1].split("`meta_info`:", 1)[0]
    meta_text = prose.split("`meta_info`:", 1)[1]
    return {
        "batch": {k for cell in table_cells for k in re.findall(r"`([a-z_]+)`", cell)},
        # `ground_truth` is a field inside reward_model, not a key
        "non_tensor_batch": set(re.findall(r"`([a-z_]+)`", non_tensor_text)) - {"ground_truth"},
        "meta_info": set(re.findall(r"`([a-z_]+)`", meta_text)),
    }


def test_schema_matches_architecture_doc():
    doc = _doc_keys()
    for part in ("batch", "non_tensor_batch", "meta_info"):
        assert doc[part] == {k.name for k in BATCH_SCHEMA if k.part == part and not k.is_pattern}, part
    section = DOC.read_text().split("## The batch schema", 1)[1]
    for key in BATCH_SCHEMA:
        if key.is_pattern:  # a family is written with its suffix named: `reward_extra_<name>`
            assert f"`{key.name[:-1]}<name>`" in section, key.name


def test_schema_dtypes_and_shapes_match_doc_table():
    section = DOC.read_text().split("## The batch schema", 1)[1].split("\n## ", 1)[0]
    for line in section.splitlines():
        if not line.startswith("| `"):
            continue
        cell, dtype, shape = (c.strip() for c in line.split("|")[1:4])
        for name in re.findall(r"`([a-z_]+)`", cell):
            assert SCHEMA_BY_NAME[name].dtype == dtype, name
            assert shape in SCHEMA_BY_NAME[name].shape, name


def test_schema_entries_are_well_formed():
    assert len(SCHEMA_BY_NAME) == len(BATCH_SCHEMA)
    for key in BATCH_SCHEMA:
        assert key.part in {"batch", "non_tensor_batch", "meta_info"}
        assert key.dtype and key.shape and key.produced_by and key.doc
        if key.part == "non_tensor_batch":
            assert key.dtype == "object" and key.shape == "[B]"
        if key.part == "batch":
            assert key.shape.startswith("[B")
    assert SCHEMA_BY_NAME["advantages"].produced_by == "driver compute_advantage"
    assert SCHEMA_BY_NAME["uid"].part == "non_tensor_batch"
    assert SCHEMA_BY_NAME["metrics"].part == "meta_info"


def test_keys_produced_by():
    assert keys_produced_by("compute_advantage") == ["advantages", "returns"]
    assert keys_produced_by("compute_values") == ["values"]


def _batch() -> DataProto:
    return DataProto.from_dict(
        {"responses": torch.zeros(2, 3, dtype=torch.int64), "response_mask": torch.ones(2, 3)},
        {"uid": ["a", "b"]},
        {"eos_token_id": 2},
    )


def test_check_batch_passes_when_present():
    check_batch(_batch(), ["responses", "response_mask", "uid", "eos_token_id"])
    check_batch(_batch(), [])


def test_check_batch_names_missing_key_and_producer():
    with pytest.raises(ValueError, match=r"missing batch\['old_log_probs'\].*actor compute_log_prob"):
        check_batch(_batch(), ["responses", "old_log_probs"])
    with pytest.raises(ValueError, match=r"missing meta_info\['temperature'\]"):
        check_batch(_batch(), ["temperature"])


def test_check_batch_reports_wrong_part_and_unknown_names():
    d = _batch()
    d.meta_info["uid"] = "x"
    d.non_tensor_batch.pop("uid")
    with pytest.raises(ValueError, match=r"non_tensor_batch\['uid'\] \(found in meta_info instead\)"):
        check_batch(d, ["uid"])
    with pytest.raises(ValueError, match="'old_log_prob' is not a key of the batch schema"):
        check_batch(d, ["old_log_prob"])
    with pytest.raises(ValueError, match="list of key names"):
        check_batch(d, "responses")
