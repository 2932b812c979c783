"""What a job shows while it works and after: progress on stderr, the
status file `tiering status` reads, the time series and per-epoch records
of the statistics, and the pictures of `tiering report`.

Nothing here changes what the job does: every part reads counters the shim,
the daemon and the policy keep (NOTE [status file], NOTE [time series])."""
