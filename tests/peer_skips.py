"""The skip of a test of a peer method whose package is not installed here."""
from __future__ import annotations

import pytest


def skip_unless_installed(method: str) -> None:
    """Skip a test of a peer method whose package is not installed here (the suite's skip, with its
    reason): `make test` passes without the peers. An installed peer that fails is a failure."""
    from workloads import peers

    try:
        peers.check_available(method)
    except peers.PeerUnavailable as exc:
        pytest.skip(str(exc))
