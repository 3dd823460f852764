"""The report stage's parts: collecting results, comparing methods, tables and figures."""
