"""A plug-in module with a bug that shows as it is imported (not an ImportError)."""

raise NameError("name 'tokenizer' is not defined")
