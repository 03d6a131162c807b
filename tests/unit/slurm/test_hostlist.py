from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gpufleet.domain.errors import InvalidInput
from gpufleet.schedulers.slurm.hostlist import compress, expand


@pytest.mark.parametrize(
    ("expr", "names"),
    [
        ("n1", ("n1",)),
        ("n[1-3]", ("n1", "n2", "n3")),
        ("n[1,3]", ("n1", "n3")),
        ("gpu[008-010],login", ("gpu008", "gpu009", "gpu010", "login")),
        ("r1-n[2-3]-x,r2-n1", ("r1-n2-x", "r1-n3-x", "r2-n1")),
        ("", ()),
        ("(null)", ()),
    ],
)
def test_expand(expr: str, names: tuple[str, ...]) -> None:
    assert expand(expr) == names


@pytest.mark.parametrize("expr", ["n[1-3", "n1]", "n[a-b]", "n[3-1]", "n[1-2][3]"])
def test_bad_hostlists_name_the_field(expr: str) -> None:
    with pytest.raises(InvalidInput) as err:
        expand(expr)
    assert err.value.field == "hostlist" and err.value.value == expr


@given(prefix=st.from_regex(r"[a-z]{1,4}", fullmatch=True), lo=st.integers(0, 500), n=st.integers(1, 40),
       width=st.integers(1, 4))
def test_range_expands_to_every_number_once(prefix: str, lo: int, n: int, width: int) -> None:
    hi = lo + n - 1
    expr = f"{prefix}[{lo:0{width}d}-{hi:0{width}d}]"
    names = expand(expr)
    assert len(names) == n == len(set(names))
    assert [int(x.removeprefix(prefix)) for x in names] == list(range(lo, hi + 1))
    if width > 1 and lo < 10 ** (width - 1):
        assert all(len(x) - len(prefix) >= width for x in names)  # zero padding kept


@pytest.mark.parametrize(
    ("names", "expr"),
    [
        (["n1", "n2", "n3"], "n[1-3]"),
        (["n3", "n1", "n1"], "n[1,3]"),
        (["gpu010", "gpu008", "gpu009", "login"], "login,gpu[008-010]"),
        (["r01-n01", "r01-n02", "r02-n01"], "r01-n[01-02],r02-n01"),
        (["n8", "n9", "n10"], "n[8-9],n10"),  # digit counts differ: n[8-10] would be right too, not minimal here
        (["a"], "a"),
    ],
)
def test_compress(names: list[str], expr: str) -> None:
    assert compress(names) == expr


_NAMES = st.lists(
    st.builds(lambda p, n, w: f"{p}{n:0{w}d}", st.sampled_from(["n", "gpu", "r01-n", "x-"]),
              st.integers(0, 300), st.integers(1, 4)) | st.sampled_from(["login", "head", "a-b"]),
    min_size=1, max_size=40)


@given(_NAMES)
def test_compress_then_expand_gives_the_same_names(names: list[str]) -> None:
    assert sorted(expand(compress(names))) == sorted(set(names))


@pytest.mark.parametrize("name", ["", "a,b", "n[1]", "two words"])
def test_compress_refuses_what_no_hostlist_can_hold(name: str) -> None:
    with pytest.raises(InvalidInput) as err:
        compress(["n1", name])
    assert err.value.field == "hostlist name"
