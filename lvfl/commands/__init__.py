"""The command layer: every `lvfl` subcommand, and what only commands need (the console, error reporting, signals).

One module per subcommand: `entry` (the front door, `lvfl --help`), `fit` (fit, validate, test and predict through
LightningCLI, with `predict` for what predict does around Lightning's loop), `export`, `bench` (a package: grids,
cells, reports), `party`, `launch` and `pki`. Beside them: `console` (what a fit prints), `errors` and
`argument_errors` (one line for a refused input), `interrupts` (SIGINT and SIGTERM), `config_files` (paths relative
to a config file, a run's saved config) and `twin` (a fit beside its Plain twin).

The library (`lvfl.protocols`, `lvfl.privacy`, `lvfl.federation`, ...) never imports this package: a script or a
notebook uses the library without the command line, and a new command is one module here.
"""
