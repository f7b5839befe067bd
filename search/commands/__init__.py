"""Subcommands beyond run/show/best. Each module here defines `register(subparsers)`; the CLI
discovers them, so a new command is one new module and no edit elsewhere."""
