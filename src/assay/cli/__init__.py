"""The ``assay`` command line (``assay.cli.main:app``); one module per subcommand."""
