import mmh3
import numpy as np
import pyarrow as pa
from hypothesis import given, settings
from hypothesis import strategies as st

from runtime.hashing import key_bucket, key_buckets, key_hash, key_hashes, murmur3_32

# Published Murmur3 x86_32 vectors (SMHasher / reference implementation).
VECTORS = [
    (b"", 0, 0x00000000),
    (b"", 1, 0x514E28B7),
    (b"", 0xFFFFFFFF, 0x81F16F39),
    (b"\x00\x00\x00\x00", 0, 0x2362F9DE),
    (b"aaaa", 0x9747B28C, 0x5A97808A),
    (b"a", 0x9747B28C, 0x7FA09EA6),
    (b"abc", 0, 0xB3DD93FA),
    (b"Hello, world!", 0x9747B28C, 0x24884CBA),
    (b"The quick brown fox jumps over the lazy dog", 0x9747B28C, 0x2FA826CD),
    (b"The quick brown fox jumps over the lazy dog", 0, 0x2E4FF723),
]


def test_murmur3_matches_published_vectors():
    for data, seed, expected in VECTORS:
        assert murmur3_32(data, seed) == expected, (data, seed)


def test_key_hash_is_seed0_utf8_masked_to_16_bits():
    for data, seed, expected in VECTORS:
        if seed == 0:
            assert key_hash(data.decode()) == expected & 0xFFFF
    assert key_hash("é") == mmh3.hash("é".encode(), 0, signed=False) & 0xFFFF


def test_vectorized_hashes_match_published_vectors():
    seed0 = [(d.decode(), e) for d, s, e in VECTORS if s == 0]
    got = key_hashes([k for k, _ in seed0])
    assert list(got) == [e & 0xFFFF for _, e in seed0]


@settings(max_examples=200, deadline=None)
@given(st.lists(st.one_of(st.none(), st.text(max_size=40)), max_size=60), st.integers(0, 5))
def test_vectorized_equals_scalar_for_any_column(keys, cut):
    array = pa.array(keys, type=pa.string())[min(cut, len(keys)) :]
    expected = [key_hash(k) if k is not None else -1 for k in array.to_pylist()]
    assert list(key_hashes(array)) == expected
    assert list(key_hashes(array.cast(pa.large_string()))) == expected


@settings(max_examples=200, deadline=None)
@given(
    st.lists(st.one_of(st.none(), st.text(max_size=40)), max_size=60),
    st.integers(0, 5),
    st.sampled_from([1, 2, 3, 7, 64, 256, 65536]),
)
def test_buckets_match_scalar_and_cover_every_bucket_evenly(keys, cut, buckets):
    """A key's bucket is its hash's high 16 bits scaled to the budget, the same in the
    vectorized and scalar paths; a keyless message's follows its offset."""
    array = pa.array(keys, type=pa.string())[min(cut, len(keys)) :]
    offsets = np.arange(100, 100 + len(array))
    got = key_buckets(array, buckets, offsets)
    expected = [key_bucket(k, buckets, o) for k, o in zip(array.to_pylist(), offsets, strict=True)]
    assert list(got) == expected
    assert all(0 <= b < buckets for b in got)
    for key in (k for k in array.to_pylist() if k is not None):
        assert key_bucket(key, buckets, 0) == (murmur3_32(key.encode()) >> 16) * buckets >> 16


def test_bucket_boundaries_split_the_high_bits_evenly():
    high = np.arange(65536, dtype=np.int64)
    for buckets in (1, 3, 256):
        counts = np.bincount((high * buckets) >> 16, minlength=buckets)
        assert counts.max() - counts.min() <= 1
