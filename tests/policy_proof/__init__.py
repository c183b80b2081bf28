"""The proof that each cell of the reliability policy is enforced: test code, not installed.

`bindings` names, per cell, the enforcing code, the test and the weakening that test must
catch; `verifier` checks that registry and the cancellation rule (on the real
confirmed-mutation path, and on the negative control of `mutation`, which must break
it); `python -m tests.contract` (`make contract`) runs each bound test under its
weakening (`tests/weakenings.py`). The installed package (`queue_server.policy`) holds
only the document, its loader and rules, and the values and helpers that run.
"""
