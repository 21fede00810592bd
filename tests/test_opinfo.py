"""OpInfo conformance: engine.vmap against a for-loop on PyTorch's operator database.

Each op's engine status (native / fallback / error / skip) must equal tests/opinfo_expectations.json,
so a regression and an unrecorded improvement both fail; regenerate with
`vmapbench coverage --update-expectations`. A mismatch (wrong values) always fails unless the op has
an entry under "xfail" with the reason it is accepted. Each op runs its first PINNED["samples"]
samples under every batch-dim pattern of the harness (batch at 0, -1 and in the middle, contiguous
and as views, expanded, one argument batched, out_dims=-1). The default run covers a
representative subset; the whole database runs under @pytest.mark.slow.
"""
from __future__ import annotations

import functools
from typing import Any

import pytest
import torch

from engine.coverage.expectations import PINNED, in_op_db, load
from engine.coverage.harness import check_op, iter_opinfos, op_key

# Representative subset: every family, the ops the workloads lean on, and a few known fallbacks.
FAST_OPS = [
    "abs", "add", "mul", "div.no_rounding_mode", "sub", "pow", "exp", "log", "sin", "tanh", "sigmoid", "where", "clamp",
    "eq", "lt", "maximum", "addcmul", "lerp", "sum", "mean", "amax", "argmax", "prod", "std", "var",
    "logsumexp", "cumsum", "sort", "topk", "cat", "stack", "reshape", "permute", "transpose", "expand",
    "flip", "roll", "tril", "diag_embed", "squeeze", "unsqueeze", "narrow", "chunk", "matmul", "mm",
    "bmm", "addmm", "einsum", "linalg.solve", "linalg.cholesky", "gather", "index_select", "scatter_add",
    "index_add", "masked_fill", "take", "nn.functional.conv2d", "nn.functional.linear",
    "softmax", "log_softmax", "_softmax_backward_data", "nn.functional.layer_norm",
    "nn.functional.relu", "nn.functional.gelu", "nn.functional.embedding", "nn.functional.cross_entropy",
    "nn.functional.mse_loss", "nn.functional.max_pool2d", "zeros_like", "new_zeros",
]

_EXPECT = load()
# The ops of this torch's op_db, as the expectations file lists them (test_expectations_file_lists_
# known_ops holds the two equal): the parameters, known without importing op_db (seconds) in each
# test process that collects this file.
_KEYS = sorted(op for op in _EXPECT["ops"] if in_op_db(op, _EXPECT))


@functools.cache
def _all() -> dict[str, Any]:
    return {op_key(o): o for o in iter_opinfos()}


def _check(key: str) -> None:
    if key not in _all():
        pytest.fail(f"{key}: in tests/opinfo_expectations.json but not in torch {torch.__version__}'s op_db "
                    "(an op of other releases only: name it in 'op_db_releases')")
    res = check_op(_all()[key], torch_func=False, **PINNED)
    xfail = _EXPECT["xfail"].get(key)
    if res.engine == "mismatch" and not xfail:
        pytest.fail(f"{key}: engine.vmap gives wrong values ({res.detail.get('engine')}); fix the rule or add a reasoned xfail")
    if xfail and res.engine != "mismatch":
        pytest.fail(f"{key}: listed as xfail ({xfail}) but now {res.engine}; remove it from 'xfail'")
    expected = _EXPECT["ops"].get(key)
    if expected is None:
        pytest.fail(f"{key}: not in tests/opinfo_expectations.json (status {res.engine}); run vmapbench coverage --update-expectations")
    assert res.engine == expected, (
        f"{key}: engine status is {res.engine!r}, expectations file says {expected!r} "
        f"(detail: {res.detail.get('engine', '')}; fallback ops: {res.fallback_ops}). If this is an "
        f"improvement, run `vmapbench coverage --ops {key} --update-expectations --no-write`."
    )


@pytest.mark.parametrize("key", [k for k in FAST_OPS if k in _KEYS])
def test_opinfo_fast(key: str) -> None:
    _check(key)


def test_fast_subset_names_exist() -> None:
    missing = [k for k in FAST_OPS if k not in _all()]
    assert not missing, f"FAST_OPS names not in op_db: {missing}"


@pytest.mark.slow
@pytest.mark.parametrize("key", sorted(set(_KEYS) - set(FAST_OPS)))
def test_opinfo_full(key: str) -> None:
    _check(key)


def test_expectations_file_lists_known_ops() -> None:
    ops = _all()
    stale = sorted(set(_KEYS) - set(ops))
    assert not stale, (f"ops in tests/opinfo_expectations.json that torch {torch.__version__}'s op_db does not "
                       f"have: {stale[:10]} (an op of other releases only: name them in 'op_db_releases')")
    here = sorted(op for op in ops if not in_op_db(op, _EXPECT))
    assert not here, f"op_db has {here[:10]}, which tests/opinfo_expectations.json's 'op_db_releases' says it lacks"
    unlisted = sorted(set(ops) - set(_EXPECT["ops"]))
    assert not unlisted, (f"op_db has {unlisted[:10]}, which tests/opinfo_expectations.json does not list (so no "
                          "test checks them): run `vmapbench coverage --update-expectations`")


def test_op_db_releases_read_as_written() -> None:
    data = {"op_db_releases": {"new": "2.14-", "old": "-2.13", "span": "2.14-2.15"}}
    assert [in_op_db(op, data, (2, 13)) for op in ("new", "old", "span", "any")] == [False, True, False, True]
    assert [in_op_db(op, data, (2, 15)) for op in ("new", "old", "span", "any")] == [True, False, True, True]
    with pytest.raises(ValueError, match="op_db_releases"):
        in_op_db("x", {"op_db_releases": {"x": "2.14"}})
