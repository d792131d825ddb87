"""The draft sources and one step's shape: the Jacobi window, the text index, the n-gram pool, the
successor table, the sources' rates, the best-first growth of the token tree, the step's layout
and mask."""
