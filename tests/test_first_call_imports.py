"""A model's first call through the engine imports neither Dynamo, inductor nor sympy: batching
rules that would reach them through torch's Python helpers (type promotion, broadcast_shapes,
meta kernels) cost most of a second in a fresh process. Checked in a fresh process."""
from __future__ import annotations

import subprocess
import sys

PROGRAM = """
import sys, torch
import torch.distributions as D
import engine
X = torch.randn(20, 3); grp = torch.randint(0, 4, (20,)); y = torch.randn(20)
def logp(th):
    beta, log_s, z = th[:3], th[3], th[4:]
    mu = X @ beta + z[grp]  # an index whose backward is an index_put
    # a batched 0-dim operand beside a float64 one: type promotion of a logical 0-dim tensor
    return (D.HalfNormal(1.).log_prob(log_s.exp()) + D.StudentT(4., mu, log_s.exp()).log_prob(y).sum()
            + (log_s * torch.tensor(2.0, dtype=torch.float64)).float())
engine.vmap(engine.grad(logp))(torch.randn(5, 8))
print(" ".join(sorted(m for m in ("torch._dynamo", "torch._inductor", "sympy") if m in sys.modules)))
"""


def test_a_distributions_models_first_call_imports_no_compiler():
    out = subprocess.run([sys.executable, "-c", PROGRAM], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "", f"the first call imported {out.stdout.strip()}"
