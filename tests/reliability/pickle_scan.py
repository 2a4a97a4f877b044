"""Proof helpers: a checkpoint folder holds no pickle (what torch.save / pickle.dump would write)."""

import os

# pickle protocol 2-5 streams start with PROTO (0x80) + version; torch.save writes a zip archive.
_PICKLE_HEADS = tuple(bytes([0x80, v]) for v in range(2, 6))
_ZIP_HEAD = b"PK\x03\x04"
_ALLOWED_SUFFIXES = (".safetensors", ".json", ".txt", ".jinja", ".model")


def assert_no_pickle(folder) -> int:
    """Every file under ``folder`` is a safetensors/JSON/text file with no pickle or zip header;
    returns the number of files checked."""
    checked = 0
    for dirpath, _, names in os.walk(folder):
        for name in names:
            path = os.path.join(dirpath, name)
            with open(path, "rb") as fh:
                head = fh.read(8)
            assert name.endswith(_ALLOWED_SUFFIXES), f"unexpected file type in a checkpoint: {path}"
            assert not head.startswith(_PICKLE_HEADS + (_ZIP_HEAD,)), f"{path} is a pickle/torch.save file"
            checked += 1
    return checked
