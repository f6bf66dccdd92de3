"""gpuprofctl's commands, one module per command group."""
