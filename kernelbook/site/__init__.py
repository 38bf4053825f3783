"""What the book's pages assemble from the records: ``kb.summary`` (the intro's table)."""
