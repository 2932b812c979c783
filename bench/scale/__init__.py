"""The scale benchmark: tier-run and `tiering plan` on ImageNet-1k's shape
(1.28 M files in 1,000 class directories) against `find`, `cp -r` and
`tar | tar`, side by side in one run.  `python -m bench.scale --help`."""
