"""The order hook: tier-run puts this directory first on a Python COMMAND's
PYTHONPATH, so that its sitecustomize.py runs at interpreter start-up (see
that module).  Nothing here is imported by tiering itself."""
