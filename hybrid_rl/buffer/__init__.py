"""The experience buffer: scored rollout rows between a rollout side and a trainer side (issue #16).

Knows no worker: the trainer writes :class:`Experience` rows (``experiences_from_batch``) and reads
them back as a rollout batch (``batch_from_experiences``). Backends: :class:`MemoryBuffer` (default)
and :class:`SQLBuffer` (any SQLAlchemy URL; a SQLite file by default). docs/buffer.md has the schema.
"""

from hybrid_rl.buffer.base import BUFFER_STORAGE_TYPES, BufferConfig, ExperienceBuffer, MemoryBuffer
from hybrid_rl.buffer.experience import (STATUSES, Experience, batch_from_experiences, check_experience,
                                         experiences_from_batch)

__all__ = ["BUFFER_STORAGE_TYPES", "STATUSES", "BufferConfig", "Experience", "ExperienceBuffer", "MemoryBuffer",
           "SQLBuffer", "batch_from_experiences", "build_buffer", "check_experience", "experiences_from_batch",
           "sql_location"]


def __getattr__(name: str):
    if name == "SQLBuffer":  # SQLAlchemy is imported only when the SQL backend is used
        from hybrid_rl.buffer.sql import SQLBuffer

        return SQLBuffer
    raise AttributeError(name)


def sql_location(config: BufferConfig, run_dir: str, experiment_name: str = "") -> tuple[str, str]:
    """(database, table) of a sql buffer: without a path, table ``experiences`` of
    ``<run_dir>/experiences.db``; with a path (perhaps shared), table ``config.name`` or the
    experiment's name."""
    import os

    from hybrid_rl.buffer.sql import DEFAULT_TABLE, table_name

    if config.path is None:
        return os.path.join(run_dir, "experiences.db"), config.name or DEFAULT_TABLE
    return config.path, config.name or table_name(experiment_name or DEFAULT_TABLE)


def build_buffer(config: BufferConfig, run_dir: str, experiment_name: str = "") -> ExperienceBuffer:
    """The backend ``config`` names, at :func:`sql_location` for sql."""
    if config.storage_type == "memory":
        return MemoryBuffer()
    from hybrid_rl.buffer.sql import SQLBuffer

    return SQLBuffer(*sql_location(config, run_dir, experiment_name))
