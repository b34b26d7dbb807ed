"""Evaluation and benchmarks: QA accuracy and fidelity (``evaluate``), the needle test
(``needle``), link TTFT vs context length (``bench``), and the scoring they share."""
