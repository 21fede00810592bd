"""A generated-module stand-in for inductor's output, shared by the fused-tier tests
(tests/test_fused.py, tests/test_fused_xla.py; not a test module itself): the arithmetic of
`x * 2 + 1`'s graph, counting its calls so a test can tell which tier answered."""

FAKE_SOURCE = """
CALLS = [0]

def call(args):
    x = args[0]  # (then the graph's numbers 2 and 1, as tensors made once: engine.graph_passes)
    args.clear()
    CALLS[0] += 1
    return (x * 2 + 1,)
"""
