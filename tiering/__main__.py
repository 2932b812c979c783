from .entry import tiering

tiering()
