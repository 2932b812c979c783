"""`tiering simulate`: a performance model of the I/O policies (NOTE [simulator])."""
