"""The verified protocol, one pipeline over one prepared-problem record (read `runner.py` first).

    rules.py        every factor and threshold (`VerifiedProtocol`, versioned)
    prepare.py      per problem: calibration, hidden trials, truth, soundness screen, timing pool, baselines
    correctness.py  per candidate: the hidden trials, integrity, then the probes
    timer.py        the interleaved timer against the live baselines (parent side)
    runner.py       the stages in order, and `judge()`
"""
