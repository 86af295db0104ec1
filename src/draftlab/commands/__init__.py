"""CLI registration, one module per area; handlers stay thin and call the library."""
