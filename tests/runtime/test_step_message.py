"""Step messages over the store: a FORWARD message round-trips; one whose sizes or indices do
not fit the receiver is a ValueError naming the field before anything is built; seals bind a
value to its key and secret; the launch secret comes from a file, the environment, or (one
node) fresh random bytes."""

from __future__ import annotations

import struct

import pytest
import torch
from stemma.runtime.config import EngineConfig
from stemma.runtime.executor.forward_batch import ForwardBatch
from stemma.runtime.executor.step_message import StepBounds, pack_step, pack_stop, unpack_step
from stemma.runtime.executor.tp_auth import (
    SECRET_ENV,
    ForgedMessage,
    launch_secret,
    seal,
    unseal,
)

BOUNDS = StepBounds(vocab_size=100, num_rows=4, num_slots=64, max_context=32)


def two_requests() -> ForwardBatch:
    """Row 1 (its third holder): 3 cached tokens + 2 new; row 2 (its first): a 4-token prompt."""
    req_to_token = torch.zeros((4, 32), dtype=torch.int32)
    req_to_token[1, :5] = torch.tensor([10, 11, 12, 13, 14])
    req_to_token[2, :4] = torch.tensor([20, 21, 22, 23])
    out = torch.tensor([13, 14, 20, 21, 22, 23], dtype=torch.int32)
    ids = [[7, 8], [1, 2, 3, 4]]
    return ForwardBatch.build(req_to_token, [1, 2], [3, 0], ids, out, row_epochs=[3, 1])


def words(data: bytes) -> list[int]:
    return list(struct.unpack(f"<{len(data) // 8}q", data))


def pack(values: list[int]) -> bytes:
    return struct.pack(f"<{len(values)}q", *values)


def test_forward_round_trips_and_stop_is_none():
    fb = two_requests()
    got = unpack_step(pack_step(fb), bounds=BOUNDS)
    assert got is not None
    assert got.input_ids.tolist() == [7, 8, 1, 2, 3, 4]
    assert got.positions.tolist() == [3, 4, 0, 1, 2, 3]
    assert got.kv_indices.tolist() == fb.kv_indices.tolist()
    assert got.seq_lens_cpu == [5, 4] and got.logits_idx.tolist() == [1, 5]
    assert got.row_epochs == [3, 1]
    assert unpack_step(pack_stop(), bounds=BOUNDS) is None


# two_requests' message: header 0-4, input_ids 5-10, prefix_lens 11-12, extend_lens 13-14,
# req_pool_idx 15-16, row_epochs 17-18, out_cache_loc 19-24, kv_indices 25-33, logits_idx 34-35.
@pytest.mark.parametrize(
    "where, value, message",
    [
        (5, 100, r"input_ids spans \[1, 100\], outside \[0, 100\)"),  # the first id
        (5 + 6 + 4, 4, r"req_pool_idx spans \[2, 4\], outside \[0, 4\)"),  # row 1 -> row 4
        (5 + 6 + 8, 64, r"out_cache_loc spans \[14, 64\]"),  # the first new slot
        (5 + 6 + 8 + 6 + 8, -1, r"kv_indices spans \[-1, 22\]"),  # the last one
        (5 + 6 + 8 + 6 + 9 + 1, 6, r"logits_idx spans \[1, 6\], outside \[0, 6\)"),
        (5 + 6 + 2, 0, r"extend_lens \[0, 4\]"),  # a request with no new token
        (0, 7, r"header \[7, 2, 6, 9, 2\] does not match"),  # no such op
        (3, 10, r"header \[1, 2, 6, 10, 2\] does not match its 36 values"),
    ],
)
def test_a_message_out_of_bounds_is_refused_naming_the_field(where, value, message):
    values = words(pack_step(two_requests()))
    values[where] = value
    with pytest.raises(ValueError, match=message):
        unpack_step(pack(values), bounds=BOUNDS)


def test_sizes_that_disagree_are_refused():
    values = words(pack_step(two_requests()))
    with pytest.raises(ValueError, match="not 8 x"):
        unpack_step(pack(values)[:-3], bounds=BOUNDS)
    values[5 + 6 + 2] = 3  # extend_lens [2, 3] sum to 5, but 6 tokens came
    with pytest.raises(ValueError, match="6 tokens and 9 kv indices for extend_lens summing"):
        unpack_step(pack(values), bounds=BOUNDS)
    with pytest.raises(ValueError, match="a 5-token sequence over 4"):
        unpack_step(pack_step(two_requests()), bounds=BOUNDS._replace(max_context=4))
    with pytest.raises(ValueError, match=r"header \[2, 0, 0, 0, 0\] does not match its 6"):
        unpack_step(pack_stop() + pack([0]), bounds=BOUNDS)  # STOP is exactly its header


def test_a_seal_binds_the_value_to_its_key_and_secret():
    secret = b"s" * 32
    sealed = seal(secret, "step/3", b"payload")
    assert len(sealed) == 32 + 7 and unseal(secret, "step/3", sealed) == b"payload"
    with pytest.raises(ForgedMessage, match="'step/4': a 39-byte value failed"):
        unseal(secret, "step/4", sealed)  # replayed under another key
    with pytest.raises(ForgedMessage):
        unseal(b"t" * 32, "step/3", sealed)
    with pytest.raises(ForgedMessage, match="a 40-byte value failed"):
        unseal(secret, "step/3", pack_stop())  # the bare STOP
    with pytest.raises(ForgedMessage):
        unseal(secret, "step/3", sealed[:-1] + b"X")


def test_the_launch_secret_comes_from_a_file_the_environment_or_chance(tmp_path, monkeypatch):
    monkeypatch.delenv(SECRET_ENV, raising=False)
    one_node = EngineConfig()
    assert len(launch_secret(one_node)) == 32 and launch_secret(one_node) != launch_secret(one_node)
    two = dict(tp_size=2, nnodes=2, dist_init_addr="127.0.0.1:1")
    with pytest.raises(ValueError, match="--dist-secret-file FILE"):
        launch_secret(EngineConfig(**two))
    monkeypatch.setenv(SECRET_ENV, "from the environment")
    assert launch_secret(EngineConfig(**two)) == b"from the environment"
    path = tmp_path / "secret"
    path.write_text("0123456789abcdef0123\n")
    assert launch_secret(EngineConfig(dist_secret_file=str(path), **two)) == b"0123456789abcdef0123"
    path.write_text("short\n")
    with pytest.raises(ValueError, match="has 5 bytes; it needs at least 16"):
        launch_secret(EngineConfig(dist_secret_file=str(path), **two))
