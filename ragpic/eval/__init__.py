"""The evaluations the user commands run: QA accuracy and fidelity (``evaluate``, ``ragpic eval``),
the needle test (``needle``), RULER-style tasks (``ruler``), link TTFT vs context length (``bench``),
the calibration (``calibrate``), the scoring they share and the figures their ``--plot`` draws.
The research harness built on them (peers such as llama.cpp, figures over several runs) lives in
the repository's ``benchmarks/``, outside the installed package."""
