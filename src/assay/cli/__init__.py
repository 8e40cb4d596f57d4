"""The ``assay`` command line: the console script (``assay.cli.main:run``), the command table (``commands``), the typer app built from it (``app``); one module per subcommand."""
