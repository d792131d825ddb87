"""The one exception type users see for bad input: printed as a single line, non-zero exit."""


class LPError(ValueError):
    """Bad input or an unusable setup (bad W/N/G, unknown model, prompt too long, rank mismatch)."""
