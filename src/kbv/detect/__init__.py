"""Detectors: pure rules over the records the verified pipeline collects. Each returns what it
found as `(Category, why)` (or a list of them); `kbv.protocols.verified.runner.judge` turns them into
the verdict. No I/O, no processes: every rule is tested on plain records.

- `evidence`: integrity violations and guard reports of a checked forward;
- `caches`: result caches (replayed outputs, constant outputs, the replay probe's timings);
- `speed`: the wall-clock bound and the impossible-speed bound;
- `attribution`: whose kernels ran, decoys, the custom-work rule;
- `soundness`: whether a problem can be passed trivially.
"""
