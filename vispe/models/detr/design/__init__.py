"""The detector's design: the query designs as one typed object, every compatibility rule, and where position enters."""
