"""The CLI subcommands, one module per command (family). ``diskguard.cli.COMMANDS`` lists
them; each module is imported only when its command runs."""
