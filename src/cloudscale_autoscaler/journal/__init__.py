"""The creation journal: the creates this provider has decided on and the API has not
confirmed yet, written down before they are sent.

A provider that dies while its creates are in flight comes back (or a standby takes over)
knowing nothing of them: the API lists a server only once it exists and offers no list of
requests in progress. Without the journal the new process answers CA a lower target and CA
plans the same scale-up again. With it, every create is recorded before it goes out, and the
next holder counts each one until it is listed or a bound passes (journal/writer.py).

- entries.py: what one record holds, and its text form (pure);
- store.py: where a record is kept (the protocol), and its errors;
- file.py: a file under `stateDir` (a single replica);
- writer.py: the one writer (claims the record, writes snapshots, coalesces).
The Kubernetes store (a ConfigMap only the leader writes) is kube/journal.py.
"""
