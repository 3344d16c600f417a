"""Consumer classes that the subprocess tests run with `python -m messenger consume`."""
