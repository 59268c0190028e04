"""The `corag` commands: one module a command, each parsing its config and calling the library."""
