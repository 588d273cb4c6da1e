"""Property-based tests of the collectives (hypothesis): for generated codecs, dtypes, sizes
(empty, one element, block boundaries), magnitudes (subnormal to near overflow), signs and
NaN, every rank checks the documented bound against a float64 reduction, finiteness for
finite input, sign preservation when every rank's values share a sign, NaN never hidden,
and bit-identical results on every rank.

Every rank draws the same examples (derandomized, no example database) and its own data
from the drawn seed and its rank; each verdict is agreed over all ranks before it is
asserted, so that a failure makes every rank shrink the same example instead of leaving
the others in the next collective."""
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from mpi4py import MPI

import mpicomp

from _mpiutil import CODECS, WORLD, allreduce_bound, compressed, digest, parts_tolerance

SIZES = [0, 1, 31, 255, 256, 257, 1000]
EXAMPLES = settings(derandomize=True, database=None, max_examples=150, deadline=None,
                    suppress_health_check=list(HealthCheck))


def everywhere(ok, why):
    """Asserts that ok holds on every rank (agreed first, so all ranks pass or fail together)."""
    oks = WORLD.allgather(bool(ok))
    assert all(oks), f"{why} (ranks {[r for r, o in enumerate(oks) if not o]})"


def inputs(seed, n, dtype, exponent, same_sign, nan_at):
    """This rank's array and its float64 values: uniform in (-2, 2) * 2**exponent (positive
    on every rank when same_sign), NaN at index nan_at on the last rank if given."""
    rng = np.random.default_rng([seed, WORLD.rank])
    x64 = rng.uniform(0 if same_sign else -2, 2, n) * 2.0**exponent
    x = x64.astype(dtype)
    if nan_at is not None and WORLD.rank == WORLD.size - 1:
        x[nan_at] = np.nan
    return x, x.astype(np.float64)


@st.composite
def cases(draw):
    codec, dtype = draw(st.sampled_from(CODECS)), draw(st.sampled_from(["float32", "float16"]))
    # Sums over 3 ranks stay inside the range of the dtype (and of fp16's wire format, whose
    # overflow to Inf is documented): the float64 reference would overflow otherwise.
    top = 13 if "float16" in (dtype, codec.replace("fp16", "float16")) else 120
    n = draw(st.sampled_from(SIZES))
    nan_at = draw(st.none() | st.integers(0, 10**6))
    return dict(codec=codec, dtype=dtype, n=n, exponent=draw(st.integers(-149 if dtype == "float32" else -24, top)),
                same_sign=draw(st.booleans()), nan_at=None if nan_at is None or not n else nan_at % n,
                seed=draw(st.integers(0, 2**32 - 1)))


def check_values(case, y64, nan_index):
    """NaN where the last rank put one (never hidden); else finite, and non-negative when
    every rank's values are."""
    if nan_index is not None:
        everywhere(np.isnan(y64.ravel()[nan_index]), f"{case}: the NaN was hidden")
        return
    everywhere(np.all(np.isfinite(y64)), f"{case}: finite input came back inf or NaN")
    if case["same_sign"]:
        everywhere(np.all(y64 >= 0), f"{case}: non-negative input came back negative")


@EXAMPLES
@given(cases())
def test_allreduce_properties(case):
    x, x64 = inputs(case["seed"], case["n"], case["dtype"], case["exponent"], case["same_sign"], case["nan_at"])
    c = mpicomp.codec(case["codec"])
    with compressed():
        y = mpicomp.allreduce(x, codec=c)
    y64 = y.astype(np.float64)
    everywhere(len(set(WORLD.allgather(digest(y)))) == 1, f"{case}: ranks got different results")
    check_values(case, y64, case["nan_at"])
    if case["nan_at"] is None:
        exact, bound = allreduce_bound(WORLD, c, x64, c.name != "none", False, case["dtype"])
        everywhere(np.all(np.abs(y64 - exact) <= bound), f"{case}: over the documented bound")


@EXAMPLES
@given(cases())
def test_allgather_properties(case):
    x, x64 = inputs(case["seed"], case["n"], case["dtype"], case["exponent"], case["same_sign"], case["nan_at"])
    c = mpicomp.codec(case["codec"])
    with compressed():
        y = mpicomp.allgather(x, codec=c)
    y64 = y.astype(np.float64)
    everywhere(len(set(WORLD.allgather(digest(y)))) == 1, f"{case}: ranks got different results")
    check_values(case, y64, None if case["nan_at"] is None else (WORLD.size - 1) * case["n"] + case["nan_at"])
    if case["nan_at"] is None:
        everyone = np.concatenate(WORLD.allgather(x64))
        bounds = [r * case["n"] for r in range(WORLD.size + 1)]
        tol = parts_tolerance(c, everyone, bounds) if c.name != "none" else 0
        # decoded to the input's dtype: one more rounding of float16 outputs
        rounding = np.abs(everyone) * 2.0**-11 + 2.0**-25 if case["dtype"] == "float16" and c.name != "none" else 0
        everywhere(np.all(np.abs(y64 - everyone) <= tol + rounding), f"{case}: over the documented bound")


@pytest.mark.parametrize("n", [0, 1, 257])
def test_none_equals_mpi_exactly_for_float64(n):
    rng = np.random.default_rng([7, n, WORLD.rank])
    x = rng.standard_normal(n) * 10.0 ** rng.integers(-300, 300, n)
    want = np.empty_like(x)
    WORLD.Allreduce(x, want, op=MPI.SUM)
    y = mpicomp.allreduce(x, codec="none")
    # MPI may sum in another order than mpicomp on 3+ ranks: equal up to float64 rounding
    everywhere(np.allclose(y, want, rtol=4 * 2.0**-52, atol=0), "codec none on float64 is not MPI's sum")
