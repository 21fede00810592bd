"""vmapbench command-line layer: the `vmapbench` console script and the glue jobs behind make targets.

The libraries live in `engine` (the vmap engine), `workloads` (the registry) and `dashboards`.
"""
