class SeriesError(Exception):
    """A failure the user can act on; the message says what is wrong and what to do."""
