"""Batching rules, one module per family; importing this package fills the rule table."""
from engine.rules import factories, linalg, pointwise, random_ops, reductions, views  # noqa: F401
from engine.rules import fft, indexing, linalg_extra, nn, views_extra  # noqa: F401  (coverage-driven families)
from engine.rules import checks  # noqa: F401  (torch.distributions: whole-batch checks)
from engine.rules import attention, embedding_bag, norms, rnn  # noqa: F401  (nn layers)
from engine.rules import embedding, norms_fast  # noqa: F401  (embedding, batch norm, layer norm backward: one kernel call)
from engine.rules import complex_ops, linalg_solve, sampling, search  # noqa: F401  (ops torch.func batches natively, #19)
from engine.rules import ctc, histograms, memory_format  # noqa: F401  (ctc_loss; histograms; channels_last copies, #19)
from engine.rules import dynamic_shape  # noqa: F401  (nonzero, unique: sizes read from the data, #26)
from engine.rules._table import PACKET_RULES, RULES, lookup, register_rule  # noqa: F401
