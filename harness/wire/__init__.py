"""What travels between the two processes: the messages and the sampling contract, the ZeroMQ link's
envelopes and addresses, its CURVE keys, the link's rules, integrity digests, limits and spans."""
