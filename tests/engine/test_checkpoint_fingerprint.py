"""The checkpoint fingerprint (prefix-hash salt, handoff layout) does not depend on where the folder is
mounted, and tells apart checkpoints that differ in their config or their weights."""

import shutil

from services.engine.checkpoint.fingerprint import SAMPLE_BYTES, checkpoint_fingerprint


def test_the_same_checkpoint_at_two_paths_has_one_fingerprint(tiny_checkpoint, tmp_path):
    original = tiny_checkpoint("k3")
    copy = shutil.copytree(original, tmp_path / "elsewhere" / "mounted")
    assert checkpoint_fingerprint(copy) == checkpoint_fingerprint(original)


def test_other_weights_or_another_config_change_the_fingerprint(tiny_checkpoint, tmp_path):
    base = checkpoint_fingerprint(tiny_checkpoint("k3"))
    assert checkpoint_fingerprint(tiny_checkpoint("k3", seed=1)) != base  # same shapes, other values
    edited = shutil.copytree(tiny_checkpoint("k3"), tmp_path / "edited")
    config = edited / "config.json"
    config.write_text(config.read_text().replace("{", '{"baton_note": 1, ', 1))
    assert checkpoint_fingerprint(edited) != base


def test_a_change_near_the_end_of_a_large_weight_file_changes_it(tmp_path):
    (tmp_path / "config.json").write_text("{}")
    weights = tmp_path / "model.safetensors"
    weights.write_bytes(bytes(3 * SAMPLE_BYTES))
    before = checkpoint_fingerprint(tmp_path)
    with weights.open("r+b") as out:
        out.seek(3 * SAMPLE_BYTES - 10)
        out.write(b"\x01")
    assert checkpoint_fingerprint(tmp_path) != before
