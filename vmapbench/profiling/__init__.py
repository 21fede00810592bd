"""Parts of `vmapbench profile`, one module per tool.

`child` is the process that runs the measured call (what py-spy attaches to and what runs under
torch.profiler), `pyspy` drives py-spy and reads its output, `flamegraph` renders stacks as SVG,
`torch_ops` turns a torch.profiler run into tables, `nvml` samples the GPU from the parent. The
orchestration (one run's plan, its processes and tools, its summary) and the printed report are
`session`; the command's arguments are vmapbench/commands/profile.py's.
"""
