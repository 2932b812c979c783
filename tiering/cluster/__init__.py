"""Multi-node building blocks: node identity, the node-local election of one
placement service, the rendezvous of the job's nodes, and the peer service."""
