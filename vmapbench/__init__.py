"""vmapbench command-line layer: the `vmapbench` console script (cli.py, one module per subcommand
in commands/), what only the commands use (the gate, the memory-limit search, the profiler) and
the `python -m vmapbench.<script>` measuring scripts behind make targets.

The libraries below it: `engine` (the vmap engine), `measuring`, `workloads` (the registry),
`suite` (asv's benchmarks) and `dashboards` (docs/design/architecture.md draws the floors).
"""
