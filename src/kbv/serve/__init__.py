"""`kbv serve`: verified rewards as an HTTP service, for RL loops and anyone else who asks.

Requests become jobs of one long run (`kbv.api.open_session`): the same store, runners and executor
as `kbv eval`, so problems stay prepared, children start ahead of their pairs, builds are shared, and
an identical (problem, code, protocol) is answered from the store without running again.

- `requests`: the JSON a client sends, parsed and checked against the service's `Limits` (pure);
- `service`:  the core without HTTP: problems, admission, coalescing, the store, draining;
- `app`:      the FastAPI routes, the token, and errors as `{"error": ...}` with their codes;
- `server`:   `serve(ServeConfig)`: binding, uvicorn, and the graceful stop on SIGTERM.

Its answers are `kbv.answer.Answer`s and its rewards `kbv.reward_rules`: they live outside the
package, beside `kbv.client`, which reads them too.

Only `app` and `server` import FastAPI and uvicorn (the `serve` extra); the rest, and `kbv.client`,
need neither.
"""
