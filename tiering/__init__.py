"""tiering: transparent storage tiering with clairvoyant prefetching for training jobs."""
__version__ = "0.1.0"
