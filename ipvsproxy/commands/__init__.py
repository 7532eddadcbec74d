"""One module per subcommand. Each exposes HELP, DESCRIPTION, add_arguments(parser) and run(args).

A subcommand that is not built yet says so through `NotImplementedCommand`.
"""
