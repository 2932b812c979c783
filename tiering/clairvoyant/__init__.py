"""Clairvoyance: the order the training will read the data set in, reproduced
(samplers, orderfile, launcher, options) or taken from inside the training
(feeds, with the hook in tiering/hook), and placement that follows it
(planner, progress, policy)."""
