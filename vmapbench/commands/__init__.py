"""One module per `vmapbench` subcommand (vmapbench/cli.py's table names them), each defining
`configure(parser)` (its arguments) and `main(args) -> int`. A command parses, calls the library
below it (measuring/, workloads/, suite/, dashboards/ or vmapbench's own modules) and prints or
writes; options several commands share are defined once, in `options`."""
