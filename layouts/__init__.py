"""Layout-annotated einsums and the global layout search (the data-movement issue fills this package)."""
