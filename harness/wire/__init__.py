"""What travels between the two processes: the messages and the sampling contract, the ZeroMQ link's
envelopes and addresses, its CURVE keys, the rule for hooks inside real servers, integrity digests, limits
and spans (the link's rules, which name transports, live with them: harness.transports.policy).

Its modules, each with its job: docs/architecture.md (Packages, bottom-up).
"""
