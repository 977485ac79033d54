"""Counter-based random bits (Philox4x32-10), as the oracle computes them.

A dropout mask (and a rand draw: the top 24 bits over 2**24) is a pure function of (seed, offset,
stream, element index): the same on any thread
count and on every backend. Element i uses word i % 4 of the block keyed by counter
(i // 4 low, i // 4 high, stream, offset) and key (seed low, seed high). An element is kept when
its top 24 bits are at least `threshold` = round(p * 2**24).
"""
import numpy as np

M0, M1 = 0xD2511F53, 0xCD9E8D57
W0, W1 = 0x9E3779B9, 0xBB67AE85
MASK32 = 0xFFFFFFFF


def philox4x32(c0, c1, c2, c3, k0, k1, rounds=10):
    """Philox4x32 on uint64 arrays that hold 32-bit words; returns the four output words."""
    c0, c1, c2, c3 = (np.asarray(c, dtype=np.uint64) for c in (c0, c1, c2, c3))
    k0, k1 = np.uint64(k0), np.uint64(k1)
    m32 = np.uint64(MASK32)
    for _ in range(rounds):
        p0 = np.uint64(M0) * c0
        p1 = np.uint64(M1) * c2
        c0, c1, c2, c3 = ((p1 >> np.uint64(32)) ^ c1 ^ k0, p1 & m32,
                          (p0 >> np.uint64(32)) ^ c3 ^ k1, p0 & m32)
        k0 = (k0 + np.uint64(W0)) & m32
        k1 = (k1 + np.uint64(W1)) & m32
    return c0, c1, c2, c3


def check_key(seed, offset):
    """(seed, offset) of a run as the two integers that key dropout's stream, or one sentence: the
    seed is 64 bits (Philox's key), the offset 32 (one word of its counter; the step of a run,
    where a larger one would repeat a smaller one's masks)."""
    out = []
    for what, v, low, high, words in (("seed", seed, -2**63, 2**64, "a whole number of 64 bits"),
                                      ("offset", offset, 0, 2**32, "a whole number from 0 to 2**32 - 1")):
        if isinstance(v, (float, np.floating)) and float(v).is_integer():
            v = int(v)
        if isinstance(v, (bool, np.bool_)) or not isinstance(v, (int, np.integer)) or not low <= int(v) < high:
            from ..errors import MicaError
            from ..tensor import user_location

            raise MicaError(f"{what} must be {words} (it keys dropout's stream with the other of seed and offset; "
                            f"the offset counts steps, the seed tells runs apart), got {v!r}", user_location())
        out.append(int(v) - 2**64 if int(v) >= 2**63 else int(v))
    return out


def threshold(p):
    return int(round(p * (1 << 24)))


def _bits(numel, seed, offset, stream):
    """The 32 random bits of elements 0..numel of one site (uint64 holding them)."""
    seed, offset = int(seed) & ((1 << 64) - 1), int(offset) & MASK32
    blocks = np.arange((numel + 3) // 4, dtype=np.uint64)
    words = philox4x32(blocks & np.uint64(MASK32), blocks >> np.uint64(32),
                       np.full(blocks.shape, stream, np.uint64), np.full(blocks.shape, offset, np.uint64),
                       seed & MASK32, seed >> 32)
    return np.stack(words, axis=1).reshape(-1)[:numel]


def keep_mask(numel, seed, offset, stream, thresh):
    """Boolean keep-mask of `numel` elements for one dropout site."""
    return (_bits(numel, seed, offset, stream) >> np.uint64(8)) >= np.uint64(thresh)


def uniform(numel, seed, offset, stream):
    """`numel` float32 draws in [0, 1) of one rand site: each element's top 24 bits times 2**-24
    (exact in float32), as the kernels' mica_uniform."""
    return ((_bits(numel, seed, offset, stream) >> np.uint64(8)).astype(np.float32) *
            np.float32(2.0 ** -24)).astype(np.float32)
