"""The seams campaign: two replicas of the real provider, a Lease and a journal they share, live
reloads, kills at any point, damaged journals and cloud faults, interleaved with the calls CA
makes, in virtual time (looptime), so that a long run covers thousands of schedules.

- clock.py: the event loop whose time runs fast while a step waits, and the thread it runs in;
- kubedouble.py: the Kubernetes API the replicas share (Leases, ConfigMaps, Events), in memory;
- replica.py: one replica (the real provider, built as `serve` builds it) and its death;
- world.py: the emulator, the double, the replicas, the config files and CA's calls;
- checks.py: the invariants;
- machine.py: the Hypothesis state machine.
"""
