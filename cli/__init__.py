"""kbert's command line (typer): one module per command group."""
