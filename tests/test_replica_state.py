"""A replica's state beside its log (``storage.replica_state``): saved whole, read back
exactly, and never replaced by a default when the file cannot be trusted."""

from __future__ import annotations

from pathlib import Path

import pytest

from runtime.errors import UnavailableError
from runtime.replication import EpochHistory
from storage.durability import Durability
from storage.replica_state import FILE_NAME, ReplicaState, ReplicaStateFile


@pytest.mark.parametrize("policy", ["fsync", "none"])
def test_the_state_is_read_back_as_saved(tmp_path: Path, policy: str) -> None:
    file = ReplicaStateFile(tmp_path, Durability(policy))
    assert file.load() == ReplicaState()  # never saved: a replica that heard of nothing
    state = ReplicaState(5, EpochHistory().begin(1, 0).begin(3, 40).begin(5, 40), 38)
    file.save(state)
    assert ReplicaStateFile(tmp_path, Durability(policy)).load() == state
    assert [p.name for p in tmp_path.iterdir()] == [FILE_NAME]  # no temporary left behind


@pytest.mark.parametrize(
    ("content", "says"),
    [
        (b"{", "Expecting"),
        (b'{"seenEpoch": 2, "history": [[1, 0]]}', "highWatermark"),
        (b'{"seenEpoch": 2, "history": [[2, 0], [1, 5]], "highWatermark": 0}', "does not follow"),
        (b'{"seenEpoch": 2, "history": [[1, 9], [2, 5]], "highWatermark": 0}', "predecessor"),
        (b'{"seenEpoch": 1, "history": [[3, 0]], "highWatermark": 0}', "older than its log"),
        (b'{"seenEpoch": -1, "history": [], "highWatermark": 0}', "not a natural number"),
        (b'{"seenEpoch": true, "history": [], "highWatermark": 0}', "not a natural number"),
        (b'{"seenEpoch": 1, "history": [[1]], "highWatermark": 0}', "not enough values"),
    ],
)
def test_a_state_that_cannot_be_trusted_is_an_error_naming_its_file(
    tmp_path: Path, content: bytes, says: str
) -> None:
    (tmp_path / FILE_NAME).write_bytes(content)
    with pytest.raises(UnavailableError, match=f"{FILE_NAME} cannot be read.*{says}"):
        ReplicaStateFile(tmp_path, Durability("none")).load()
